"""Request routers on Ray Serve, live: ours against Ray's two, same replicas, interleaved.

    python scripts/bench_ray_routers.py [--model builtin:tiny] [--rounds 2] \\
        [--workloads shared-prefix multi-turn agent] [--concurrency 4] [--out FILE.json]

Starts a local Ray cluster (127.0.0.1), and per round deploys the application with each
request router in turn (``prefixcache``, ``prefix_affinity``, ``pow2``; the order rotates
every round), 2 engine replicas each time, freshly started (cold pools), then sends each
workload through the ingress (streamed, greedy, the bench client of ``prefixcache bench``).
Per (router, workload, round): hit rate (cached prompt tokens / prompt tokens, as the
replicas report them), TTFT p50 / p99, errors, and how many requests each replica took.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixcache.bench.client import ServingTarget, run_workload  # noqa: E402
from prefixcache.bench.prompts import TokenizerRenderer  # noqa: E402
from prefixcache.bench.workloads import WorkloadConfig, build_workload  # noqa: E402

ROUTERS = ("prefixcache", "prefix_affinity", "pow2")


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workloads", nargs="+", default=["shared-prefix", "multi-turn", "agent"])
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-prompt-tokens", type=int, default=3000)
    p.add_argument("--out", type=Path, default=Path("/tmp/bench_ray_routers.json"))
    p.add_argument("--routers", nargs="+", default=list(ROUTERS), choices=ROUTERS)
    p.add_argument("--balance-abs-tokens", type=int, default=None,
                   help="our router's balance_abs_tokens (default: the router's)")
    args = p.parse_args()

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "600")
    import ray
    from ray import serve

    from prefixcache.config import EngineConfig
    from prefixcache.deploy.ray.app import DeploySettings, build_application
    from prefixcache.model.loader import load_tokenizer
    from prefixcache.server.app import ServerSettings

    cfg = WorkloadConfig(num_prefixes=4, questions_per_prefix=6, prefix_min_chars=1500,
                         prefix_max_chars=2500, oasst_conversations=4, glaive_conversations=4,
                         agent_max_calls=8, max_prompt_tokens=args.max_prompt_tokens)
    tokenizer, _ = load_tokenizer(args.model)
    renderer = TokenizerRenderer(tokenizer)
    workloads = {}
    for name in args.workloads:
        reqs = build_workload(name, cfg,
                              measure=lambda r: len(renderer.render(r).token_ids))
        workloads[name] = (reqs, {r.id: renderer.render(r) for r in reqs})
        print(f"{name}: {len(reqs)} requests", flush=True)

    port = 8577
    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    rows = []
    kwargs = ({} if args.balance_abs_tokens is None
              else {"balance_abs_tokens": args.balance_abs_tokens})
    try:
        for rnd in range(args.rounds):
            k = rnd % len(args.routers)
            order = args.routers[k:] + args.routers[:k]
            for router in order:
                t0 = time.perf_counter()
                app = build_application(
                    EngineConfig(model=args.model, compute_backend="torch"),
                    ServerSettings(model_names=[args.model], model_root=args.model),
                    DeploySettings(replicas=2, router=router, cpus_per_replica=1,
                                   router_kwargs=kwargs if router == "prefixcache" else {}))
                serve.delete("prefixcache")
                serve.run(app, name="prefixcache", route_prefix="/")
                print(f"round {rnd} {router}: deployed in {time.perf_counter() - t0:.0f}s",
                      flush=True)
                target = ServingTarget(f"http://127.0.0.1:{port}", args.model,
                                       extra_body=lambda r: {"ignore_eos": True})
                for name, (reqs, prompts) in workloads.items():
                    run = asyncio.run(run_workload(target, reqs, prompts,
                                                   concurrency=args.concurrency))
                    ok = [r for r in run.results if r.error is None]
                    prompt = sum(r.prompt_tokens for r in ok)
                    cached = sum(r.cached_tokens or 0 for r in ok)
                    ttft = [r.first_token_time - r.send_time for r in ok
                            if r.first_token_time is not None]
                    row = {"round": rnd, "router": router, "workload": name,
                           "requests": len(run.results), "errors": len(run.results) - len(ok),
                           "hit_rate": cached / prompt if prompt else 0.0,
                           "ttft_p50_s": statistics.median(ttft) if ttft else None,
                           "ttft_p99_s": percentile(ttft, 0.99), "wall_s": run.wall_s}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    args.out.write_text(json.dumps(rows, indent=1))
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
