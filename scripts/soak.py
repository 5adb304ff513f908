"""Soak: resident memory of ``prefixcache serve`` under a steady load, over time.

For each concurrency, starts ``prefixcache serve`` (``builtin:tiny`` and a pool of 512
pages by default) with a key file of two tenants, and runs that many clients for
``--duration-s`` seconds. Each client loops: a completion of a prompt of 100-600 tokens
(half of them behind a per-tenant shared prefix, so both cache hits and cold prefills
happen), ``max_tokens`` 8-64, with the key of one of the two tenants. Every
``--sample-s`` seconds the server's resident memory (psutil RSS) is read. Afterwards the
script waits until ``kv_pages_live`` (``/metrics``) is 0 and checks the pool is whole
(free + cached + pinned pages = total). The server runs the ``prefixcache`` this script
imports (``PYTHONPATH`` or the installed one; printed), started outside the repository so
that ``python -m`` does not pick the checkout in the current directory instead.

Reported per concurrency: requests, errors (non-200 answers and transport errors), RSS at
the end of warm-up (``--warmup-s``), the highest and last RSS after it, their difference
(the band), the least-squares slope of RSS after warm-up (MiB/min), pages live after the
load and whether the pool is whole; the RSS series goes to the JSON.

    python scripts/soak.py --duration-s 600 --concurrency 16 64 --out benchmarks/soak/raw
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

import prefixcache

WORDS = ("cache page token prefix tenant model request server memory pool step batch "
         "kernel shape queue block hash tier disk host redis router gateway").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def metrics(base: str) -> dict[str, float]:
    """The unlabelled samples of ``/metrics`` by name."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.partition(" ")
            out[name] = float(value)
    return out


def text(rng: random.Random, tokens: int) -> str:
    """About ``tokens`` tokens of the byte tokenizer (one per byte)."""
    words: list[str] = []
    size = 0
    while size < tokens:
        w = rng.choice(WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:tokens]


async def client(base: str, model: str, keys: list[str], shared: dict[str, str],
                 seed: int, deadline: float, tally: dict[str, int]) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=300) as http:
        while time.monotonic() < deadline:
            key = rng.choice(keys)
            n = rng.randint(100, 600)
            prompt = (shared[key] + text(rng, max(n - len(shared[key]), 10))
                      if rng.random() < 0.5 else text(rng, n))
            body = {"model": model, "prompt": prompt, "max_tokens": rng.randint(8, 64),
                    "temperature": 0.0}
            try:
                r = await http.post(f"{base}/v1/completions", json=body,
                                    headers={"Authorization": f"Bearer {key}"})
                tally["requests"] += 1
                if r.status_code != 200:
                    tally["errors"] += 1
            except httpx.HTTPError:
                tally["requests"] += 1
                tally["errors"] += 1


async def load(base: str, model: str, keys: list[str], concurrency: int, duration_s: float,
               sample_s: float, proc: psutil.Process) -> tuple[dict[str, int], list[list[float]]]:
    rng = random.Random(0)
    shared = {k: text(rng, 256) for k in keys}
    tally = {"requests": 0, "errors": 0}
    t0 = time.monotonic()
    deadline = t0 + duration_s
    series: list[list[float]] = []

    async def sample() -> None:
        while time.monotonic() < deadline:
            series.append([round(time.monotonic() - t0, 1),
                           round(proc.memory_info().rss / 2**20, 1), tally["requests"]])
            await asyncio.sleep(sample_s)

    await asyncio.gather(sample(), *(client(base, model, keys, shared, i, deadline, tally)
                                     for i in range(concurrency)))
    series.append([round(time.monotonic() - t0, 1),
                   round(proc.memory_info().rss / 2**20, 1), tally["requests"]])
    return tally, series


def slope_mib_per_min(points: list[list[float]]) -> float:
    if len(points) < 2:
        return 0.0
    xs, ys = [p[0] / 60 for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def run_one(args: argparse.Namespace, concurrency: int, workdir: Path) -> dict:
    keys = {"soak-key-a": {"tenant": "a"}, "soak-key-b": {"tenant": "b"}}
    key_file = workdir / "keys.json"
    key_file.write_text(json.dumps(keys))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "prefixcache", "serve", "--model", args.model,
            "--num-pages", str(args.num_pages), "--port", str(port), "--api-keys",
            str(key_file), "--no-access-log",
            *args.serve_arg]
    log = workdir / f"serve_c{concurrency}.log"
    root = str(Path(prefixcache.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=workdir,
                            env=env, start_new_session=True)
    try:
        wait_http(f"{base}/health")
        model = httpx.get(f"{base}/v1/models", timeout=30,
                          headers={"Authorization": "Bearer soak-key-a"}).json()["data"][0]["id"]
        tally, series = asyncio.run(load(base, model, list(keys), concurrency, args.duration_s,
                                         args.sample_s, psutil.Process(proc.pid)))
        deadline = time.monotonic() + 120
        m = metrics(base)
        while m.get("kv_pages_live", -1) != 0 and time.monotonic() < deadline:
            time.sleep(0.5)
            m = metrics(base)
    finally:
        stop(proc)
    after = [p for p in series if p[0] >= args.warmup_s]
    warm = after[0][1] if after else series[-1][1]
    top = max(p[1] for p in after) if after else warm
    pool = [m.get(k, 0) for k in ("kv_pages_free", "kv_pages_cached", "kv_pages_pinned")]
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    return {"concurrency": concurrency, "duration_s": args.duration_s, "served_from": root,
            "commit": commit or None,
            "warmup_s": args.warmup_s, **tally,
            "rss_start_mib": series[0][1], "rss_warm_mib": warm, "rss_max_after_warm_mib": top,
            "rss_end_mib": series[-1][1], "band_mib": round(top - warm, 1),
            "slope_mib_per_min": round(slope_mib_per_min(after), 2),
            "pages_live_after": m.get("kv_pages_live"), "pages_total": m.get("kv_pages_total"),
            "pool_whole": m.get("kv_pages_live") == 0 and sum(pool) == m.get("kv_pages_total"),
            "series_s_rss_mib_requests": series}


def markdown(rows: list[dict]) -> str:
    head = ("| concurrency | duration s | requests | errors | RSS start | RSS after warm-up | "
            "max after | end | band | slope MiB/min | pages live after | pool whole |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {r['concurrency']} | {r['duration_s']:.0f} | {r['requests']} | {r['errors']} | "
        f"{r['rss_start_mib']} | {r['rss_warm_mib']} | {r['rss_max_after_warm_mib']} | "
        f"{r['rss_end_mib']} | {r['band_mib']} | {r['slope_mib_per_min']} | "
        f"{r['pages_live_after']:.0f} | {r['pool_whole']} |\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--num-pages", type=int, default=512)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="RSS band and slope are taken after this many seconds")
    ap.add_argument("--sample-s", type=float, default=5.0)
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument for serve (repeat for each)")
    ap.add_argument("--out", type=Path, default=None, help="folder for soak.json / soak.md")
    args = ap.parse_args()
    print(f"serving {prefixcache.__file__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in args.concurrency:
            rows.append(run_one(args, c, Path(tmp)))
            print(markdown(rows[-1:]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "soak.json").write_text(json.dumps(rows, indent=1) + "\n")
        (args.out / "soak.md").write_text(markdown(rows))
    print(markdown(rows))


if __name__ == "__main__":
    main()
