"""Online: 2 replicas (1 compute thread each) behind the router, with and without Redis.

    python scripts/bench_router_online.py [--model builtin:tiny] [--rounds 2]
        [--concurrency 4] [--out benchmarks/router/raw]

Configurations: ``round_robin`` (router --policy round_robin), ``cache_aware``, each also
``+redis`` (replicas with ``--kv-store``). Each run starts a fresh redis-server,
fresh replicas (``--kv-events-endpoint``) and a fresh router, then sends one mixed workload
through the router: shared-prefix (users sharing a long system prompt), multi-turn
(conversations whose next turn carries the previous ones) and agent (a tool spec plus a
growing trajectory). Prompts are sent as text to ``/v1/completions`` with streaming, so
TTFT is measured at the first streamed chunk; ``cached_tokens`` is what the replica reported.
Configurations are interleaved over ``--rounds`` rounds (order rotated each round).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
CONFIGS = ("round_robin", "round_robin+redis", "cache_aware", "cache_aware+redis")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_http(url: str, timeout: float = 120.0) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def workload(seed: int) -> list[list[str]]:
    """Sessions: each a list of prompts sent in order (one session at a time each)."""
    rng = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(f"w{rng.randrange(10_000)}" for _ in range(n // 6))

    system = "SYSTEM: " + text(1500)
    sessions = [[system + f"\nUSER {u}: " + text(200)] for u in range(12)]  # shared prefix
    for c in range(4):  # multi-turn
        turns, history = [], f"CHAT {c}: " + text(300)
        for _ in range(4):
            history += f"\nUSER: {text(150)}\nASSISTANT: {text(100)}"
            turns.append(history)
        sessions.append(turns)
    tools = "TOOLS: " + text(1200)
    for a in range(3):  # agent trajectories
        traj, steps = tools + f"\nTASK {a}: " + text(100), []
        for s in range(4):
            traj += f"\nCALL {s}: {text(60)}\nRESULT: {text(120)}"
            steps.append(traj)
        sessions.append(steps)
    rng.shuffle(sessions)
    return sessions


async def one(client: httpx.AsyncClient, base: str, model: str, prompt: str) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    usage = None
    async with client.stream("POST", base + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None:
                ttft = time.perf_counter() - t0
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert usage is not None and ttft is not None
    return {"ttft": ttft, "prompt": usage["prompt_tokens"],
            "cached": usage["prompt_tokens_details"]["cached_tokens"]}


async def drive(base: str, model: str, sessions: list[list[str]], concurrency: int) -> dict:
    sem = asyncio.Semaphore(concurrency)
    results: list[dict] = []
    async with httpx.AsyncClient(timeout=300) as client:
        async def session(prompts: list[str]) -> None:
            for p in prompts:
                async with sem:
                    results.append(await one(client, base, model, p))

        t0 = time.perf_counter()
        await asyncio.gather(*(session(s) for s in sessions))
        wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    return {"requests": len(results), "wall_s": wall, "req_per_s": len(results) / wall,
            "hit_rate": sum(r["cached"] for r in results) / sum(r["prompt"] for r in results),
            "ttft_p50_s": statistics.median(ttfts),
            "ttft_p99_s": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))]}


def run_config(config: str, args: argparse.Namespace, tmp: Path, seed: int) -> dict:
    procs = []
    try:
        redis_url = None
        if config.endswith("redis"):
            port = free_port()
            procs.append(start([shutil.which("redis-server") or "redis-server", "--port",
                                str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no", "--maxmemory", "256mb",
                                "--maxmemory-policy", "allkeys-lru", "--dir", str(tmp)],
                               tmp / "redis.log"))
            redis_url = f"redis://127.0.0.1:{port}/0"
            time.sleep(0.5)
        replicas = []
        for i in range(2):
            port, ev = free_port(), f"tcp://127.0.0.1:{free_port()}"
            argv = [sys.executable, "-m", "prefixcache.cli", "serve", "--model", args.model,
                    "--port", str(port), "--num-threads", "1", "--num-pages",
                    str(args.num_pages), "--log-level", "warning", "--no-access-log",
                    "--kv-events-endpoint", ev]
            if redis_url:
                argv += ["--kv-store", redis_url, "--tier-load-policy", "always"]
            procs.append(start(argv, tmp / f"replica{i}.log"))
            replicas.append((f"http://127.0.0.1:{port}", ev))
        for url, _ in replicas:
            wait_http(url + "/health")
        rport = free_port()
        argv = [sys.executable, "-m", "prefixcache.cli", "router", "--model", args.model,
                "--port", str(rport), "--log-level", "warning", "--policy",
                "round_robin" if config.startswith("round_robin") else "cache_aware"]
        for url, ev in replicas:
            argv += ["--replica", f"{url},events={ev}"]
        procs.append(start(argv, tmp / "router.log"))
        base = f"http://127.0.0.1:{rport}"
        wait_http(base + "/health")
        out = asyncio.run(drive(base, args.model_name, workload(seed), args.concurrency))
        out["config"] = config
        return out
    finally:
        for p in reversed(procs):
            stop(p)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--model-name", default=None, help="the served name (default --model)")
    p.add_argument("--num-pages", type=int, default=1024, help="each replica's KV pool")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "router" / "raw"))
    args = p.parse_args()
    args.model_name = args.model_name or args.model
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
            for config in order:
                row = run_config(config, args, Path(tmp), seed=r)
                row["round"] = r
                rows.append(row)
                print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "online.json").write_text(json.dumps(
        {"settings": vars(args) | {"out": None}, "rows": rows}, indent=1) + "\n")
    write_md(rows, out / "online.md", args)
    return 0


def write_md(rows: list[dict], path: Path, args: argparse.Namespace) -> None:
    """Mean over rounds, with the spread (min-max) of each figure."""
    def cell(vals: list[float], fmt: str) -> str:
        return f"{fmt.format(statistics.fmean(vals))} ({fmt.format(min(vals))}-" \
               f"{fmt.format(max(vals))})"

    lines = ["# Online: 2 replicas behind the router", "",
             f"Model `{args.model}`, 1 compute thread per replica, {args.num_pages}-page pools, "
             f"concurrency {args.concurrency}, 40 requests per run (12 shared-prefix users, 4 "
             "conversations x 4 turns, 3 agents x 4 steps), 8 output tokens each; "
             f"{args.rounds} interleaved rounds: mean (min-max). "
             "Produced by `scripts/bench_router_online.py`.", "",
             "| configuration | hit rate | TTFT p50 (s) | TTFT p99 (s) | requests/s |",
             "|---|---:|---:|---:|---:|"]
    for c in CONFIGS:
        rs = [r for r in rows if r["config"] == c]
        lines.append(f"| {c} | {cell([100 * r['hit_rate'] for r in rs], '{:.1f}%')} | "
                     f"{cell([r['ttft_p50_s'] for r in rs], '{:.3f}')} | "
                     f"{cell([r['ttft_p99_s'] for r in rs], '{:.2f}')} | "
                     f"{cell([r['req_per_s'] for r in rs], '{:.2f}')} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
