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


@pytest.fixture
def mixed_model_log(write_jsonl):
    def rec(rid, model, prompt, out):
        return {"request_id": rid, "model": model, "prompt": prompt,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": out,
                          "prompt_tokens_details": {"cached_tokens": 0}}}
    p1200 = list(range(1, 1201))
    return write_jsonl([
        rec("a", "gpt-4o", p1200, 10), rec("b", "gpt-4o", p1200 + list(range(2001, 2101)), 20),
        rec("c", "gpt-4.1-mini", list(range(3001, 3051)), 5),
        rec("d", "gpt-4o-2024-08-06", list(range(4001, 4041)), 4),
        rec("e", "mystery-model", list(range(5001, 5031)), 2),
    ])


def test_openai_prices_each_request_by_its_model(tmp_path, mixed_model_log, capsys):
    r = run_json(tmp_path, mixed_model_log, "--prices", "openai", "--no-sweeps")
    (c,) = r["costs"]
    assert c["label"] == "openai/by-model/automatic"
    assert c["cached_tokens"] == 1152  # b reads nine 128-token units of a (>= 1024)
    per = {m["model"]: m for m in c["models"]}
    # USD per 1M: gpt-4o 2.50 / 1.25 cached / 10 out; gpt-4.1-mini 0.40 / 1.60;
    # gpt-4.1 (the default row) 2.00 / 8.00
    assert per["gpt-4o"]["flat"] == pytest.approx((2500 * 2.5 + 30 * 10) / 1e6)
    assert per["gpt-4o"]["cache_aware"] == pytest.approx(
        ((2500 - 1152) * 2.5 + 1152 * 1.25 + 30 * 10) / 1e6)
    assert per["gpt-4.1-mini"]["flat"] == pytest.approx((50 * 0.4 + 5 * 1.6) / 1e6)
    assert per["gpt-4o-2024-08-06"]["row"] == "gpt-4o"
    assert per["gpt-4o-2024-08-06"]["flat"] == pytest.approx((40 * 2.5 + 4 * 10) / 1e6)
    assert per["mystery-model"]["flat"] == pytest.approx((30 * 2.0 + 2 * 8.0) / 1e6)
    assert c["flat"] == pytest.approx(6794 / 1e6) and c["cache_aware"] == pytest.approx(5354 / 1e6)
    assert c["substitutions"] == [{"model": "mystery-model", "row": "gpt-4.1",
                                   "how": "default row", "requests": 1, "substituted": True}]
    assert c["recorded"]["cost"] == pytest.approx(6794 / 1e6)  # the log's usage, same rows
    # mapped explicitly, and the terminal names the substitution
    assert main(["analyze", str(mixed_model_log), "--prices", "openai", "--no-sweeps",
                 "--price-model", "mystery-model=gpt-4o-mini"]) == 0
    out = capsys.readouterr().out
    assert "openai: 1 requests of mystery-model priced as gpt-4o-mini (--price-model)" in out
    assert main(["analyze", str(mixed_model_log), "--prices", "openai", "--quiet",
                 "--price-model", "mystery-model=nope"]) == 2
    assert main(["analyze", str(mixed_model_log), "--quiet", "--price-model", "gpt-4o"]) == 2
    err = capsys.readouterr().err
    assert "--price-model mystery-model=nope" in err and "--price-model 'gpt-4o'" in err


def test_capacity_under_a_sweep_page_skips_that_block_size(tmp_path, token_log, capsys):
    r = run_json(tmp_path, token_log, "--capacity-tokens", "20", "--block-size", "16",
                 "--no-cost")
    assert r["capacity_tokens"] == 20 and r["num_pages"] == 1
    assert [p["block_size"] for p in r["sweeps"]["block_size"]] == [16]
    assert r["sweeps"]["block_size_skipped"] == [32, 64, 128, 256]
    assert main(["analyze", str(token_log), "--capacity-tokens", "20", "--no-cost"]) == 0
    assert "Block sizes skipped (larger than the capacity of 20 tokens): 32, 64, 128, " \
        "256" in capsys.readouterr().out
    assert main(["analyze", str(token_log), "--capacity-tokens", "8", "--quiet"]) == 2
    assert main(["analyze", str(token_log), "--capacity-bytes", "100", "--kv-bytes-per-token",
                 "10", "--block-size", "32", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--capacity-tokens 8 is less than one page (--block-size 16)" in err
    assert "--capacity-bytes 100 at 10 KV bytes per token (10 tokens) is less than one page " \
        "(--block-size 32)" in err


def test_capacity_sweep_spans_one_page_to_unlimited(tmp_path, token_log):
    r = run_json(tmp_path, token_log, "--no-cost")
    sw = r["sweeps"]
    assert sw["working_set_pages"] == 5  # a: 2 pages, b: 1 more, c (tenant t2): 2
    assert [(p["capacity_tokens"], p["cached_tokens"], p["failed"]) for p in sw["capacity"]] \
        == [(16, 0, 3), (32, 0, 3), (48, 0, 1), (64, 32, 0), (80, 32, 0), (None, 32, 0)]
    assert sw["capacity"][-1]["hit_rate"] == r["hit_rate_unbounded"]
