"""Tables, goals, plots and RESULTS.md from handmade summaries."""
from __future__ import annotations

import json

from prefixcache.bench import report
from prefixcache.bench.metrics import RequestResult, RunInfo, summarize


def run(workload, peer, mode, *, ttfts, cached, prompt=1000, wall=10.0, ref=None, tenants=None):
    rs = []
    for i, (t, c) in enumerate(zip(ttfts, cached)):
        rs.append(RequestResult(id=f"r{i}", session=f"s{i % 2}", turn=i // 2, group="g",
                                tenant=(tenants or [None] * len(ttfts))[i], warm_expected=i > 0,
                                prompt_tokens=prompt, cached_tokens=c, output_tokens=8,
                                send_time=float(i), first_token_time=i + t,
                                end_time=i + t + 0.5, reference_prompt_tokens=ref and prompt,
                                reference_cached_tokens=ref and int(prompt * ref)))
    info = RunInfo(workload=workload, model="bench", peer=peer, mode=mode, dtype="float32",
                   threads=2, concurrency=4, machine="test box")
    ids = {r.id: [1] * prompt for r in rs}
    return summarize(info, rs, wall_s=wall, peak_rss=2**28, token_ids=ids,
                     reference_hit_rate=ref if workload == "agent" else None)


def summaries():
    s = [run("shared-prefix", "prefixcache", "offline", ttfts=[1.0, 0.04, 0.04, 0.04],
             cached=[0, 960, 960, 960]),
         run("shared-prefix", "prefixcache-nocache", "offline", ttfts=[1.0, 1.0, 1.0, 1.0],
             cached=[0, 0, 0, 0]),
         run("agent", "prefixcache", "offline", ttfts=[1, 0.1, 0.1, 0.1],
             cached=[0, 990, 990, 990], ref=0.7),
         run("multi-tenant", "prefixcache", "serving", ttfts=[1, 1, 0.1, 0.1],
             cached=[0, 0, 960, 960], tenants=["a", "b", "a", "b"])]
    for w in ("shared-prefix", "multi-turn"):
        s.append(run(w, "prefixcache", "serving", ttfts=[1, 0.1, 0.1, 0.1],
                     cached=[0, 960, 960, 960], wall=5))
        s.append(run(w, "vllm", "serving", ttfts=[1, 0.2, 0.2, 0.2], cached=[0, 896, 896, 896],
                     wall=6))
        s.append(run(w, "llamacpp", "serving", ttfts=[1, 1, 1, 1], cached=[None] * 4, wall=20))
    return s


def test_goals_status_from_figures():
    gs = {g.name: g for g in report.goals(summaries())}
    g = gs["TTFT speedup, warm over cold, at ~96% hit rate (shared-prefix)"]
    assert g.status == "met" and g.figure.startswith("25.0×")
    assert "caching off: 1000 ms, 25.0×" in g.figure
    assert gs["Agent-loop hit rate vs DeepSeek's recorded rate (same calls)"].status == "met"
    assert gs["Cross-tenant hits (multi-tenant)"].status == "met"
    assert gs["shared-prefix serving: TTFT p50 vs vLLM-CPU"].status == "met"
    assert gs["multi-turn serving: throughput vs vLLM-CPU"].figure.startswith("1.20×")
    # 4× < 5×
    assert gs["multi-turn serving: throughput vs llama-cpp-python server"].status == "missed"
    assert gs["shared-prefix serving: throughput vs transformers"].status == "not measured"


def test_write_reports_creates_every_file(tmp_path):
    s = summaries()
    context = {"model": "bench", "dtype": "float32", "threads": 2, "concurrency": 4,
               "machine": "test box"}
    files = report.write_reports(s, tmp_path, context=context,
                                 command="prefixcache bench --workload all")
    for name in ("results.jsonl", "results.md", "RESULTS.md", "ttft_cold_warm_shared-prefix.png",
                 "hit_rate_per_turn_multi-turn.png", "hit_rate_per_call_agent.png"):
        assert name in files and files[name].stat().st_size > 0, name
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(rows) == len(s) and all("per_request" not in r for r in rows)
    assert all(k in rows[0] for k in report.REQUIRED_KEYS)
    md = (tmp_path / "RESULTS.md").read_text()
    assert "## Goals" in md and "threads per peer: 2" in md
    assert "![ttft_cold_warm_shared-prefix]" in md
    table = (tmp_path / "results.md").read_text().splitlines()
    assert len(table) == 2 + len(s)
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_hit_rate_by_turn():
    rows = [{"turn": 0, "cached_tokens": 0, "prompt_tokens": 100, "reference_cached_tokens": 64,
             "reference_prompt_tokens": 100},
            {"turn": 1, "cached_tokens": 90, "prompt_tokens": 100},
            {"turn": 1, "cached_tokens": 70, "prompt_tokens": 100},
            {"turn": 2, "cached_tokens": 1, "prompt_tokens": 1, "error": "x"}]
    assert report.hit_rate_by_turn(rows) == {0: 0.0, 1: 0.8}
    assert report.hit_rate_by_turn(rows, reference=True) == {0: 0.64}


def test_results_say_when_each_peer_was_measured(tmp_path):
    s = summaries()
    for x in s:
        x["peer_detail"] = {"engine": x["peer"]}
        x["measured_at"] = "2026-11-30 11:40 UTC" if x["peer"] == "vllm" else "2026-11-30 10:20 UTC"
    s[0]["measured_at"] = "2026-11-30 10:05 UTC"
    report.write_reports(s, tmp_path, context={"machine": "test box"})
    md = (tmp_path / "RESULTS.md").read_text()
    assert ("- vllm (serving): engine=vllm; measured 2026-11-30 11:40 UTC to "
            "2026-11-30 11:40 UTC") in md
    assert ("- prefixcache (offline): engine=prefixcache; measured 2026-11-30 10:05 UTC to "
            "2026-11-30 10:20 UTC") in md


def test_runs_with_failed_requests_carry_their_first_errors_and_fail_the_command(capsys):
    from prefixcache.bench import cli
    from prefixcache.bench.runner import BenchResult, Skip

    def res(rid, error):
        return RequestResult(id=rid, session=rid, turn=0, group="g", tenant=None,
                             warm_expected=False, prompt_tokens=10, cached_tokens=0,
                             output_tokens=0 if error else 2,
                             send_time=0.0, first_token_time=None if error else 0.5,
                             end_time=0.6, error=error)

    info = RunInfo(workload="few-shot", model="bench", peer="vllm", mode="serving",
                   dtype="float32", threads=2, concurrency=4, machine="test box")
    too_long = "HTTP 400: prompt too long"
    rs = [res("a", None), res("b", too_long), res("c", too_long), res("d", "no token received")]
    bad = summarize(info, rs, wall_s=1.0, peak_rss=None)
    assert (bad["requests"], bad["errors"]) == (4, 3)
    assert bad["first_errors"] == ["b: HTTP 400: prompt too long", "d: no token received"]
    assert "| few-shot | vllm (serving) | 4 | 4 (3 err) |" in report.markdown_table([bad])
    assert report.errors_table([bad]).splitlines()[2] == (
        "| few-shot | vllm (serving) | 3 of 4 "
        "| b: HTTP 400: prompt too long<br>d: no token received |")
    good = summarize(info, rs[:1], wall_s=1.0, peak_rss=None)
    assert good["first_errors"] == [] and report.errors_table([good]) == ""
    assert cli.exit_status(BenchResult([good], [Skip("llamacpp", "serving", "not installed")],
                                       {}, {}, {})) == 0
    assert capsys.readouterr().err == ""
    assert cli.exit_status(BenchResult([bad], [], {}, {}, {})) == 1
    assert capsys.readouterr().err == ("prefixcache bench: few-shot on vllm (serving): 3 of 4 "
                                       "requests failed, first: b: HTTP 400: prompt too long\n")


def test_a_failed_peer_is_a_row_and_its_goals_say_so():
    failed = [{"peer": "vllm", "mode": "serving",
               "reason": "failed to start: boom | bang\nlog tail", "failed": True}]
    ours = run("shared-prefix", "prefixcache", "serving", ttfts=[1, 0.1], cached=[0, 960])
    table = report.markdown_table([ours], failed)
    assert table.splitlines()[-1] == ("| – | vllm (serving) | **failed to start: boom \\| bang** |"
                                      + " – |" * 11)
    gs = {g.name: g for g in report.goals([ours], failed)}
    g = gs["shared-prefix serving: TTFT p50 vs vLLM-CPU"]
    assert (g.figure, g.status) == ("vLLM-CPU failed to start: boom | bang", "failed to start")
    assert gs["shared-prefix serving: throughput vs vLLM-CPU"].status == "failed to start"
    llama = gs["shared-prefix serving: throughput vs llama-cpp-python server"]
    assert llama.status == "not measured"
    # our own failure: every goal that needs our runs says so
    gs = report.goals([], [{"peer": "prefixcache", "mode": "offline",
                            "reason": "failed to start: oom"}])
    assert gs[0].status == "failed to start" and gs[0].figure == "prefixcache failed to start: oom"
