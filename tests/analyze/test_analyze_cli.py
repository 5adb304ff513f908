"""``prefixcache analyze`` end to end: JSON report, plots, terminal table, errors."""
import json

import pytest

from helpers.data import shared_data
from prefixcache.cli import main

P40 = list(range(1, 41))


@pytest.fixture
def token_log(write_jsonl):
    usage = {"prompt_tokens": 40, "completion_tokens": 5,
             "prompt_tokens_details": {"cached_tokens": 0}}
    return write_jsonl([
        {"request_id": "a", "tenant": "t1", "prompt": P40, "timestamp": 0, "usage": usage},
        {"request_id": "b", "tenant": "t1", "prompt": P40 + list(range(41, 61)),
         "timestamp": 10, "usage": {**usage, "prompt_tokens": 60,
                                    "prompt_tokens_details": {"cached_tokens": 32}}},
        {"request_id": "c", "tenant": "t2", "prompt": P40, "timestamp": 20},
    ])


def run_json(tmp_path, *argv):
    out = tmp_path / "report.json"
    assert main(["analyze", *map(str, argv), "--json", str(out), "--quiet"]) == 0
    return json.loads(out.read_text())


def test_json_report_exact(tmp_path, token_log):
    r = run_json(tmp_path, token_log, "--block-size", "16", "--prices", "deepseek")
    assert (r["requests"], r["prompt_tokens"], r["cached_tokens"]) == (3, 140, 32)
    assert r["hit_rate"] == 32 / 140 and r["hit_rate_unbounded"] == 32 / 140
    assert [c["cached_tokens"] for c in r["calls"]] == [0, 32, 0]
    assert [c["request_id"] for c in r["calls"]] == ["a", "b", "c"]
    assert r["calls"][1]["recorded"]["cached_tokens"] == 32
    assert r["tenants"]["t1"]["prompt_tokens"] == 100 and r["tenants"]["t1"]["cached_tokens"] == 32
    assert r["tenants"]["t2"]["hit_rate"] == 0.0
    assert [b["block_size"] for b in r["sweeps"]["block_size"]] == [16, 32, 64, 128, 256]
    assert [b["cached_tokens"] for b in r["sweeps"]["block_size"]] == [32, 32, 0, 0, 0]
    (cost,) = r["costs"]
    assert cost["label"] == "deepseek/deepseek-chat/automatic"
    # DeepSeek's 64-token unit: nothing of the 40-token prefix is cacheable
    assert cost["cached_tokens"] == 0 and cost["output_tokens"] == 10
    assert cost["flat"] == pytest.approx((140 * 0.28 + 10 * 0.42) / 1e6, rel=1e-12)
    assert r["validation"]["calls"] == 2 and r["validation"]["recorded_cached_tokens"] == 32


def test_capacity_in_bytes(tmp_path, token_log):
    r = run_json(tmp_path, token_log, "--capacity-bytes", "640", "--kv-bytes-per-token", "10",
                 "--no-cost", "--no-sweeps")
    assert r["capacity_tokens"] == 64 and r["num_pages"] == 4 and r["capacity_bytes"] == 640
    assert r["cached_tokens"] == 32 and r["evictions"] == 2 and r["failed_requests"] == 0


def test_plots_and_terminal_table(tmp_path, token_log, capsys):
    plots = tmp_path / "plots"
    assert main(["analyze", str(token_log), "--plots", str(plots), "--calls"]) == 0
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["hit_rate_per_call.png", "hit_rate_vs_block_size.png",
                     "hit_rate_vs_capacity.png"]
    out = capsys.readouterr().out
    for text in ("hit rate, unlimited capacity", "Per tenant", "Per call", "Cost: flat",
                 "Hit rate by block size", "Prefix-sharing tree"):
        assert text in out


def test_errors_exit_2(tmp_path, token_log, capsys):
    assert main(["analyze", str(tmp_path / "missing.jsonl"), "--quiet"]) == 2
    assert main(["analyze", str(token_log), "--prices", "nosuch", "--quiet"]) == 2
    assert main(["analyze", str(token_log), "--capacity-bytes", "10", "--quiet"]) == 2
    assert main(["analyze", str(token_log), "--capacity-tokens", "8", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "no built-in price sheet" in err and "KV bytes per token" in err


@pytest.mark.parametrize("path", [
    "swe-agent/gpt4_swe-agent__test-repo-i1.traj",
    "swe-agent/demo_marshmallow-1867_function_calling_replace_from_source.traj",
    "mini-swe-agent/tests/local.traj.json",
    "mini-swe-agent/deepseek_pr816/django__django-14752.traj.json",
])
def test_every_trajectory_format_with_costs(tmp_path, path):
    r = run_json(tmp_path, shared_data("agent_trajectories") / path, "--no-sweeps")
    assert r["requests"] > 0 and 0 < r["hit_rate"] < 1
    assert {c["provider"] for c in r["costs"]} == {"anthropic", "deepseek", "gemini",
                                                   "openai", "self-hosted"}
    # automatic caching never costs more; writes or storage can
    assert all(c["cache_aware"] <= c["flat"] for c in r["costs"] if c["kind"] == "automatic")


def test_swe_agent_history_elision_is_the_top_breaker(tmp_path):
    path = shared_data("agent_trajectories") / \
        "swe-agent/demo_marshmallow-1867_function_calling_replace_from_source.traj"
    r = run_json(tmp_path, path, "--no-sweeps", "--no-cost")
    top = r["breakers"]["groups"][0]
    assert top["key"].startswith("tool message")
    assert "⟦Old environment output" in top["example"]["context"]
