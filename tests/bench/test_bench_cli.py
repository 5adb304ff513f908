"""`prefixcache bench` argument handling and --report-only."""
from __future__ import annotations

import argparse
import json

import pytest

from prefixcache.bench import cli


def parse(*argv):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    cli.add_parser(sub)
    return parser.parse_args(["bench", *argv])


def test_defaults_and_sizes():
    a = parse()
    assert a.workload == "all" and a.mode == "all" and a.concurrency == 4
    assert a.model == "smollm2-135m-instruct-q4_1"
    assert a.offline_concurrency == 1
    assert a.peers == ["prefixcache", "prefixcache-nocache", "transformers", "vllm", "llamacpp",
                       "llamaserver"]
    assert a.quantization == "auto"
    cfg = cli.workload_config(parse("--num-prefixes", "8", "--prefix-chars", "100:200",
                                    "--max-tokens", "32", "--no-reuse-requests", "3",
                                    "--no-reuse-prompt-tokens", "128",
                                    "--no-reuse-max-tokens", "256"))
    got = (cfg.num_prefixes, cfg.prefix_min_chars, cfg.prefix_max_chars, cfg.max_tokens,
           cfg.no_reuse_requests, cfg.no_reuse_prompt_tokens, cfg.no_reuse_max_tokens)
    assert got == (8, 100, 200, 32, 3, 128, 256)
    assert cli.workload_config(parse()).no_reuse_max_tokens is None


def test_workload_names():
    assert cli.workload_names("all", None) == ["shared-prefix", "few-shot", "multi-turn", "agent",
                                               "cold-burst", "multi-tenant"]
    assert cli.workload_names("all", "log.jsonl")[-1] == "replay"
    assert cli.workload_names("agent,few-shot", None) == ["agent", "few-shot"]
    assert cli.workload_names("no-reuse", None) == ["no-reuse"]  # on request only
    with pytest.raises(SystemExit, match="unknown workload 'nope'"):
        cli.workload_names("nope", None)
    with pytest.raises(SystemExit, match="needs --requests"):
        cli.workload_names("replay", None)


def test_unknown_peer_is_refused():
    with pytest.raises(SystemExit, match="unknown peer 'tgi'"):
        cli.run(parse("--peers", "prefixcache,tgi"))


def save_run(out, mode: str, concurrency: int) -> None:
    """One saved shared-prefix run of ours (one 10-token request) under ``out/runs``."""
    from prefixcache.bench.metrics import RequestResult, RunInfo, summarize

    info = RunInfo(workload="shared-prefix", model="bench", peer="prefixcache", mode=mode,
                   dtype="float32", threads=2, concurrency=concurrency, machine="test")
    rs = [RequestResult(id="a", session="a", turn=0, group="g", tenant=None, warm_expected=False,
                        prompt_tokens=10, cached_tokens=0, output_tokens=2, send_time=0.0,
                        first_token_time=0.5, end_time=0.6)]
    runs = out / "runs"
    runs.mkdir(exist_ok=True)
    (runs / f"shared-prefix__prefixcache__{mode}.json").write_text(
        json.dumps(summarize(info, rs, wall_s=1.0, peak_rss=None)))


def test_report_only_rebuilds_from_saved_runs(tmp_path):
    save_run(tmp_path, "offline", 1)
    assert cli.run(parse("--report-only", "--out", str(tmp_path))) == 0
    assert "shared-prefix" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "RESULTS.md").is_file()
    with pytest.raises(SystemExit, match="no runs"):
        cli.run(parse("--report-only", "--out", str(tmp_path / "empty")))


def test_engine_flags_are_the_engines_and_the_workload_seed_has_its_own_name():
    a = parse()
    assert (a.dtype, a.block_size, a.kv_cache_gib, a.workload_seed) == ("float32", 16, 2.0, 0)
    a = parse("--dtype", "bf16", "--block-size", "32", "--kv-cache-gib", "0.5",
              "--workload-seed", "9")
    assert (a.dtype, a.block_size, a.kv_cache_gib) == ("bfloat16", 32, 0.5)
    assert cli.workload_config(a).seed == 9
    with pytest.raises(SystemExit):
        parse("--seed", "9")  # --seed is the engine's seed; bench has none


def test_bench_engine_takes_a_model_dir(tmp_path):
    from prefixcache.bench import engine_perf

    parser = argparse.ArgumentParser()
    engine_perf.add_parser(parser.add_subparsers(dest="command"))
    a = parser.parse_args(["bench-engine", "--dtype", "fp32"])
    assert (a.model, a.dtype) == ("smollm2-135m-instruct-q4_1", "float32")
    a = parser.parse_args(["bench-engine", "--model", str(tmp_path), "--out", str(tmp_path)])
    with pytest.raises(FileNotFoundError, match=f"--model: no config.json in {tmp_path}"):
        engine_perf.run(a)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 300}))
    assert engine_perf._vocab_size(tmp_path) == 300


def test_report_only_keeps_the_failed_peers_of_the_last_run(tmp_path):
    save_run(tmp_path, "serving", 4)
    runs = tmp_path / "runs"
    failed = {"peer": "vllm", "mode": "serving", "reason": "failed to start: no such model",
              "failed": True}
    (runs / "context.json").write_text(json.dumps({"context": {"failed": [failed]}}))
    assert cli.run(parse("--report-only", "--out", str(tmp_path))) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "- vllm (serving): failed to start: no such model" in text
    assert ("| shared-prefix serving: TTFT p50 vs vLLM-CPU | ≤ vLLM | vLLM-CPU failed to start: "
            "no such model | **failed to start** |") in text
    assert "| – | vllm (serving) | **failed to start: no such model** |" in (
        tmp_path / "results.md").read_text()
