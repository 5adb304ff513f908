"""``prefixcache bench-cache``: the cache core on its own, without a model.

Two modes:

``mooncake``
    Replays the Mooncake conversation trace (Kimi production traffic; each request
    lists the ids of its 512-token prompt blocks, equal ids meaning an equal prefix)
    through :class:`~prefixcache.cache.KVCacheManager` with ``block_size = 512``, one
    page per hash id, at several pool sizes with LRU eviction, plus an infinite pool.
    Page tokens are synthesized per id (the id repeated 512 times, so equal ids give
    equal pages); the last block of a prompt is partial (``input_length`` is rarely a
    multiple of 512) and is never shared. Requests are replayed one at a time in trace
    order (admit, take the hit, prefill, free), so the whole pool serves as cache;
    ``--concurrency N`` keeps the N most recent requests running instead, holding their
    pages. The hit rate counts whole 512-token blocks: cached tokens over the prompt's
    whole-block tokens. The infinite-cache rate is also recomputed from the hash ids
    alone, as a check of the replay.

``hash-speed``
    One 32,768-token prompt (2,048 pages of 16), cold (empty cache) and warm (the same
    prompt published before): the time of hashing + matching alone (``take_hits`` on a
    new page table), and of the full admit / allocate / commit / free cycle. Median of
    several runs, in microseconds per prompt token, wall-clock and thread CPU time (the
    CPU figure is the one to trust on a shared machine).

Output: a rich table, and ``--json PATH`` for the figures. Progress bars (tqdm, on
stderr) count the replays and the timed runs; ``--no-progress`` turns them off.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

from prefixcache.cache import KVCacheManager
from prefixcache.cache.driver import ReplayDriver
from prefixcache.engine.args import positive_int
from prefixcache.paths import data_root

MOONCAKE_BLOCK = 512
TRACE_FILE = ("mooncake_traces", "conversation_trace.jsonl")  # under the data root
DEFAULT_POOL_PAGES = "256,512,1024,2048,4096,8192,16384,32768"
SPEED_TARGET_US_PER_TOKEN = 0.3


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench-cache", help="benchmark the cache core alone (trace replay, hash speed)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["mooncake", "hash-speed", "all"], nargs="?",
                   default="all", help="what to run (default: all)")
    p.add_argument("--trace", type=Path, default=None,
                   help="Mooncake trace (default: mooncake_traces/conversation_trace.jsonl "
                        "in the shared data folder, $PREFIXCACHE_DATA)")
    p.add_argument("--pool-pages", default=DEFAULT_POOL_PAGES,
                   help="comma-separated pool sizes in 512-token pages (default: %(default)s)")
    p.add_argument("--pool-tokens", default=None,
                   help="comma-separated pool sizes in tokens (rounded down to pages); "
                        "replaces --pool-pages")
    p.add_argument("--limit", type=positive_int, default=None,
                   help="replay only the first N requests")
    p.add_argument("--concurrency", type=positive_int, default=1,
                   help="requests kept running at once during the replay (default: 1)")
    p.add_argument("--prompt-tokens", type=positive_int, default=32768,
                   help="hash-speed prompt length (default: %(default)s)")
    p.add_argument("--block-size", type=positive_int, default=16,
                   help="hash-speed page size (default: %(default)s)")
    p.add_argument("--runs", type=positive_int, default=9, help="hash-speed runs per figure")
    p.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    p.add_argument("--markdown", type=Path, default=None,
                   help="also write the tables as Markdown here")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _bar(args, total: int, desc: str):
    """A tqdm bar over ``total`` steps (disabled by ``--no-progress``)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="step", leave=False,
                disable=getattr(args, "no_progress", False))


# -- Mooncake replay ------------------------------------------------------------------------

def default_trace() -> Path:
    """The Mooncake trace in the shared data folder (:func:`prefixcache.paths.data_root`)."""
    return data_root().joinpath(*TRACE_FILE)


def load_trace(path: Path, limit: int | None = None) -> list[dict]:
    rows: list[dict] = []
    with open(path) as f:
        for line in f:
            if line.strip():
                r = json.loads(line)
                n = len(r["hash_ids"])
                if n != -(-r["input_length"] // MOONCAKE_BLOCK):
                    raise ValueError(f"request {len(rows)}: {n} hash ids for "
                                     f"{r['input_length']} tokens")
                rows.append(r)
                if limit is not None and len(rows) >= limit:
                    break
    return rows


def trace_tokens(row: dict) -> list[int]:
    """Synthesized prompt: each block is its hash id repeated (the last one partial)."""
    ids, n = row["hash_ids"], row["input_length"]
    toks: list[int] = []
    for h in ids[:-1]:
        toks += [h] * MOONCAKE_BLOCK
    toks += [ids[-1]] * (n - MOONCAKE_BLOCK * (len(ids) - 1))
    return toks


def whole_blocks(row: dict) -> int:
    return row["input_length"] // MOONCAKE_BLOCK


def ideal_hits(rows: list[dict]) -> list[int]:
    """Infinite-cache hit per request in blocks, from the hash ids alone: the longest
    run of leading whole blocks seen before, never covering the last prompt token."""
    seen: set[int] = set()
    out = []
    for r in rows:
        ids = r["hash_ids"]
        limit = (r["input_length"] - 1) // MOONCAKE_BLOCK
        k = 0
        while k < limit and ids[k] in seen:
            k += 1
        out.append(k)
        seen.update(ids[:whole_blocks(r)])
    return out


def replay(rows: list[dict], num_pages: int, concurrency: int = 1) -> dict[str, Any]:
    """Replay the trace through a manager of ``num_pages`` pages of 512 tokens."""
    mgr = KVCacheManager(num_pages, MOONCAKE_BLOCK, model_id="mooncake", root_seed="bench")
    driver = ReplayDriver(mgr, concurrency=max(1, concurrency))
    skipped = 0
    hit_blocks = []
    t0 = time.perf_counter()
    for i, r in enumerate(rows):
        done = driver.serve(f"r{i}", trace_tokens(r))
        skipped += not done.fits  # larger than the whole pool: computed without caching
        hit_blocks.append(done.cached_tokens // MOONCAKE_BLOCK)
    driver.finish()
    elapsed = time.perf_counter() - t0
    s = mgr.stats()
    blocks = sum(whole_blocks(r) for r in rows)
    return {
        "pool_pages": num_pages,
        "pool_tokens": num_pages * MOONCAKE_BLOCK,
        "requests": len(rows),
        "skipped_too_large": skipped,
        "hit_blocks": sum(hit_blocks),
        "whole_blocks": blocks,
        "block_hit_rate": sum(hit_blocks) / blocks if blocks else 0.0,
        "token_hit_rate": s["hit_rate"],
        "evictions": s["evictions"],
        "published_pages": s["published_pages"],
        "replay_s": elapsed,
        "per_request_hit_blocks": hit_blocks,
    }


def run_mooncake(args) -> dict[str, Any]:
    path = args.trace or default_trace()
    if not path.exists():
        raise SystemExit(f"trace not found: {path} (pass --trace or set PREFIXCACHE_DATA)")
    rows = load_trace(path, args.limit)
    if args.pool_tokens:
        sizes = [int(x) // MOONCAKE_BLOCK for x in args.pool_tokens.split(",") if x.strip()]
    else:
        sizes = [int(x) for x in args.pool_pages.split(",") if x.strip()]
    ideal = ideal_hits(rows)
    total_pages = sum(len(r["hash_ids"]) for r in rows)
    bar = _bar(args, len(sizes) + 1, f"mooncake replay, {len(rows):,} requests")
    infinite = replay(rows, total_pages + 1, args.concurrency)  # never evicts
    bar.update(1)
    mismatch = sum(1 for a, b in zip(infinite["per_request_hit_blocks"], ideal) if a != b)
    results = []
    for n in sizes:
        res = replay(rows, n, args.concurrency)
        res["vs_infinite"] = (res["block_hit_rate"] / infinite["block_hit_rate"]
                              if infinite["block_hit_rate"] else 0.0)
        results.append(res)
        bar.update(1)
    bar.close()
    for res in results + [infinite]:
        del res["per_request_hit_blocks"]
    infinite["vs_infinite"] = 1.0
    return {
        "trace": str(path),
        "requests": len(rows),
        "block_size": MOONCAKE_BLOCK,
        "concurrency": args.concurrency,
        "whole_blocks": sum(whole_blocks(r) for r in rows),
        "prompt_tokens": sum(r["input_length"] for r in rows),
        "distinct_whole_blocks": len({h for r in rows for h in r["hash_ids"][:whole_blocks(r)]}),
        "infinite_from_hash_ids": sum(ideal) / max(1, sum(whole_blocks(r) for r in rows)),
        "infinite_replay_mismatched_requests": mismatch,
        "pools": results,
        "infinite": infinite,
    }


# -- hash speed -----------------------------------------------------------------------------

def _timed(fn) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.thread_time()
    fn()
    return time.perf_counter() - w0, time.thread_time() - c0


def run_hash_speed(args) -> dict[str, Any]:
    n, bs, runs = args.prompt_tokens, args.block_size, args.runs
    rng = random.Random(0)
    prompt = [rng.randrange(32000) for _ in range(n)]
    pages = -(-n // bs)
    mgr = KVCacheManager(2 * pages + 8, bs, model_id="bench", root_seed="bench")
    seq = iter(range(10**9))

    def match():  # hash + match: a new table and its admission lookup
        pt = mgr.new_page_table(f"m{next(seq)}", prompt)
        got = mgr.take_hits(pt)
        return pt, got

    def cycle():  # admit, allocate, commit, free
        pt, _ = match()
        rest = n - pt.num_computed_tokens
        assert mgr.allocate(pt, rest)
        mgr.commit(pt, rest)
        mgr.free(pt)

    figures: dict[str, Any] = {}
    bar = _bar(args, 2 * (runs + 1), f"hash speed, {n:,} tokens")
    for warm in (False, True):
        label = "warm" if warm else "cold"
        mt, ct = [], []
        for _ in range(runs + 1):  # the first run warms up Python
            mgr.reset()
            if warm:
                cycle()
            holder: dict[str, Any] = {}
            mt.append(_timed(lambda h=holder: h.update(r=match())))
            pt, got = holder["r"]
            expect = ((n - 1) // bs) * bs if warm else 0
            assert got == expect, (label, got, expect)
            mgr.free(pt)
            mgr.reset()
            if warm:
                cycle()
            ct.append(_timed(cycle))
            bar.update(1)
        for name, samples in (("hash_match", mt[1:]), ("full_cycle", ct[1:])):
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            figures[f"{label}_{name}"] = {
                "wall_ms": wall * 1e3, "cpu_ms": cpu * 1e3,
                "wall_us_per_token": wall * 1e6 / n, "cpu_us_per_token": cpu * 1e6 / n,
                "cpu_us_per_page": cpu * 1e6 / pages, "runs": runs,
            }
    bar.close()
    return {"prompt_tokens": n, "block_size": bs, "pages": pages,
            "target_us_per_token": SPEED_TARGET_US_PER_TOKEN, "figures": figures}


# -- output ---------------------------------------------------------------------------------

def _machine() -> dict[str, Any]:
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "load_avg_1m": load}


def mooncake_rows(m: dict) -> list[list[str]]:
    out = []
    for r in m["pools"] + [m["infinite"]]:
        size = "infinite" if r is m["infinite"] else f"{r['pool_pages']:,}"
        toks = "-" if r is m["infinite"] else f"{r['pool_tokens'] / 1e6:.2f}M"
        out.append([size, toks, f"{r['block_hit_rate']:.1%}", f"{r['vs_infinite']:.1%}",
                    f"{r['token_hit_rate']:.1%}", f"{r['evictions']:,}",
                    str(r["skipped_too_large"]), f"{r['replay_s']:.1f}"])
    return out


MOONCAKE_HEADER = ["pool pages", "pool tokens", "block hit rate", "vs infinite",
                   "token hit rate", "evictions", "too large", "replay s"]
SPEED_HEADER = ["prompt", "cache", "what", "CPU ms", "CPU µs/token", "wall µs/token",
                "target"]


def speed_rows(s: dict) -> list[list[str]]:
    out = []
    for key, f in s["figures"].items():
        cache, what = key.split("_", 1)
        if what == "hash_match":  # the target is for hashing + matching
            ok = "meets" if f["cpu_us_per_token"] <= s["target_us_per_token"] else "MISSES"
            target = f"≤ {s['target_us_per_token']} ({ok})"
        else:
            target = "-"
        out.append([f"{s['prompt_tokens']:,} tok", cache, what.replace("_", " "),
                    f"{f['cpu_ms']:.2f}", f"{f['cpu_us_per_token']:.3f}",
                    f"{f['wall_us_per_token']:.3f}", target])
    return out


def to_markdown(result: dict) -> str:
    def table(header, rows):
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)

    parts = ["# Cache core benchmark (`prefixcache bench-cache`)", ""]
    mach = result["machine"]
    load = [mach.get("load_avg_1m_start"), mach.get("load_avg_1m")]
    load_txt = " → ".join(f"{x:.1f}" for x in load if x is not None) or "unknown"
    parts.append(f"Machine: {mach['cpus']} CPUs ({mach['machine']}), Python {mach['python']}; "
                 f"1-minute load average {load_txt} (start → end; other sessions share it). "
                 "Regenerate with `prefixcache bench-cache all --runs 15 --json "
                 "benchmarks/cache_core/raw/cache_core.json "
                 "--markdown benchmarks/cache_core/RESULTS.md`.")
    if "mooncake" in result:
        m = result["mooncake"]
        parts += ["", "## Mooncake conversation trace replay", "",
                  f"{m['requests']:,} requests, {m['prompt_tokens']:,} prompt tokens, "
                  f"{m['whole_blocks']:,} whole 512-token blocks "
                  f"({m['distinct_whole_blocks']:,} distinct). One page per hash id "
                  f"(`block_size = 512`), LRU eviction, requests replayed in trace order, "
                  f"{m['concurrency']} running at a time. Hit rate = cached tokens / "
                  "whole-block prompt tokens.", "",
                  table(MOONCAKE_HEADER, mooncake_rows(m)), "",
                  f"Infinite-cache block hit rate recomputed from the hash ids alone: "
                  f"{m['infinite_from_hash_ids']:.2%} (requests where the replay differs: "
                  f"{m['infinite_replay_mismatched_requests']}).", "",
                  "- *block hit rate*: cached tokens over the whole 512-token blocks of the "
                  "prompts; *token hit rate*: over all prompt tokens (partial last blocks "
                  "included); *vs infinite*: block hit rate over the infinite pool's.",
                  "- A hit never covers the last prompt token, so a prompt that is an exact "
                  "multiple of 512 tokens never hits its last block, even with an infinite "
                  "pool.",
                  "- Only prompts are replayed: the hash ids describe prompts, and a "
                  "conversation's next prompt already contains the previous answer.",
                  "- With one request at a time the whole pool is cache; "
                  "`--concurrency N` keeps N requests running, holding their pages."]
    if "hash_speed" in result:
        s = result["hash_speed"]
        parts += ["", "## Hashing and matching speed", "",
                  f"One {s['prompt_tokens']:,}-token prompt ({s['pages']:,} pages of "
                  f"{s['block_size']}). *hash match*: a new page table and its admission "
                  "lookup (`take_hits`: hashes every page, then matches); *full cycle*: "
                  "admit, allocate, commit, free. Median of "
                  f"{next(iter(s['figures'].values()))['runs']} runs. *cold*: empty "
                  "cache, every page hashed and the first lookup misses; *warm*: the "
                  "prompt was published before, so 2,047 lookups verify and take pages "
                  "(the page holding the last token is computed). CPU time is the "
                  "thread's own; load from other processes inflates it less than wall "
                  "time, but it does inflate it (see the load average above).", "",
                  table(SPEED_HEADER, speed_rows(s))]
    return "\n".join(parts) + "\n"


def run(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    result: dict[str, Any] = {"machine": _machine()}
    if args.mode in ("mooncake", "all"):
        result["mooncake"] = run_mooncake(args)
        m = result["mooncake"]
        t = Table(title=f"Mooncake replay: {m['requests']:,} requests, block 512, "
                        f"concurrency {m['concurrency']}")
        for h in MOONCAKE_HEADER:
            t.add_column(h, justify="right")
        for row in mooncake_rows(m):
            t.add_row(*row)
        console.print(t)
        console.print(f"infinite cache from hash ids: {m['infinite_from_hash_ids']:.2%} "
                      f"(mismatched requests: {m['infinite_replay_mismatched_requests']})")
    if args.mode in ("hash-speed", "all"):
        result["hash_speed"] = run_hash_speed(args)
        t = Table(title="Hashing and matching speed")
        for h in SPEED_HEADER:
            t.add_column(h, justify="right")
        for row in speed_rows(result["hash_speed"]):
            t.add_row(*row)
        console.print(t)
    result["machine"] = _machine() | {"load_avg_1m_start": result["machine"]["load_avg_1m"]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(to_markdown(result))
    return 0
