"""`prefixcache bench` end to end on the built-in model: every workload, offline and
serving (our own server), with small sizes; the JSON rows carry exact work counts."""
from __future__ import annotations

import json

from helpers.data import shared_data
from prefixcache.bench import cli
from tests.bench.test_bench_cli import parse

BLOCK = 16
BURST = 3
SMALL = ["--model", "builtin:tiny", "--peers", "prefixcache,prefixcache-nocache", "--no-progress",
         "--max-tokens", "3", "--num-prefixes", "2", "--questions-per-prefix", "2",
         "--prefix-chars", "300:400", "--fewshot-questions", "2", "--oasst-conversations", "1",
         "--glaive-conversations", "1", "--agent-max-calls", "2",
         "--agent-sources", "mini-swe-agent",
         "--max-prompt-tokens", "3500", "--burst-size", str(BURST), "--tenants", "2",
         "--tenant-prefixes", "1", "--tenant-questions", "2", "--block-size", str(BLOCK),
         "--kv-cache-gib", "0.05"]
KEYS = {"workload", "model", "requests", "prompt_tokens", "cached_tokens", "hit_rate",
        "prefill_tokens_computed", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s",
        "effective_prefill_tok_s", "output_tok_s", "requests_per_s", "peak_rss_mib", "threads"}


def replay_log(path, text: str) -> str:
    """Two tenants send the same long prompt twice each, a second apart."""
    lines = [{"prompt": text, "max_tokens": 2, "tenant": t, "timestamp": 100.0 + i}
             for i, t in enumerate(["a", "b", "a", "b"])]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return str(path)


def run_rows(tmp_path, mode: str, workloads: str, extra=()) -> dict[tuple[str, str], dict]:
    out = tmp_path / f"{mode}.jsonl"
    assert cli.run(parse("--workload", workloads, "--mode", mode, "--json", str(out),
                         "--out", str(tmp_path / mode), *SMALL, *extra)) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {(r["workload"], r["peer"]): r for r in rows}


def check_counts(rows: dict, workloads: list[str]) -> None:
    for w in workloads:
        on, off = rows[(w, "prefixcache")], rows[(w, "prefixcache-nocache")]
        for r in (on, off):
            assert KEYS <= set(r), sorted(KEYS - set(r))
            assert r["errors"] == 0 and r["requests"] > 0
        assert on["prompt_tokens"] == off["prompt_tokens"] and on["requests"] == off["requests"]
        assert off["cached_tokens"] == 0 and off["prefill_tokens_computed"] == off["prompt_tokens"]
        # a hit skips exactly its tokens
        assert on["prefill_tokens_computed"] == on["prompt_tokens"] - on["cached_tokens"]
        assert on["cached_tokens"] % BLOCK == 0
    burst = rows[("cold-burst", "prefixcache")]
    n = burst["prompt_tokens"] // BURST
    assert burst["requests"] == BURST and burst["prompt_tokens"] == BURST * n
    # one prefill, then each follower recomputes only the page holding its last token
    assert burst["prefill_tokens_computed"] == n + (BURST - 1) * (n - (n - 1) // BLOCK * BLOCK)
    tenants = rows[("multi-tenant", "prefixcache")]
    assert tenants["cross_tenant_hits"] == 0 and tenants["cached_tokens"] > 0


def test_every_workload_offline_on_the_builtin_model(tmp_path):
    shared_data("agent_trajectories")
    text = "You are a careful assistant. " * 20
    rows = run_rows(tmp_path, "offline", "all",
                    ["--requests", replay_log(tmp_path / "log.jsonl", text)])
    names = ["shared-prefix", "few-shot", "multi-turn", "agent", "cold-burst", "multi-tenant",
             "replay"]
    assert {w for w, _ in rows} == set(names)
    check_counts(rows, names)
    replay = rows[("replay", "prefixcache")]
    n = replay["prompt_tokens"] // 4
    # each tenant's second request hits its own first one; none crosses tenants
    assert replay["cached_tokens"] == 2 * ((n - 1) // BLOCK * BLOCK)
    assert replay["cross_tenant_hits"] == 0
    assert (tmp_path / "offline" / "RESULTS.md").is_file()
    assert sorted(p.name for p in (tmp_path / "offline" / "plots").glob("*.png"))


def test_serving_mode_against_our_server(tmp_path):
    shared_data("agent_trajectories")
    names = ["shared-prefix", "cold-burst", "multi-tenant"]
    rows = run_rows(tmp_path, "serving", ",".join(names))
    check_counts(rows, names)
    assert all(r["mode"] == "serving" for r in rows.values())
