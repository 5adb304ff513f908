"""Offline replay of the Mooncake traces through routing policies over simulated replicas.

    python scripts/bench_router_sim.py [--trace conversation] [--replicas 4 8 16 32]
        [--pool-blocks 4000] [--prefill-tok-s 602] [--load-tok-s 6020] [--util 0.7]
        [--out benchmarks/router/raw]

Each simulated replica is a FIFO prefill queue with an LRU pool of ``--pool-blocks``
512-token blocks (the traces' hash ids are chained prefix blocks). A request's TTFT is its
wait behind the queued work plus its own prefill: uncached tokens at ``--prefill-tok-s``
(measured: see the README), blocks loaded from the shared tier at ``--load-tok-s``.
Decode is not modelled. Arrival times are scaled so that the offered prefill work is
``--util`` of the cluster's capacity without any cache (the same load for every N).

Policies: ``round_robin``; ``least_loaded`` (shortest queue); ``cache_aware`` (the
router's own :class:`~prefixcache.router.policy.Policy` and
:class:`~prefixcache.router.index.PageIndex`, fed by every replica's stores and
evictions as KV events would); ``cache_aware+L4`` (the same, plus a shared tier holding
every block any replica computed, bounded by ``--l4-blocks``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prefixcache.router.index import PageIndex  # noqa: E402
from prefixcache.router.policy import Policy, ReplicaLoad  # noqa: E402

BLOCK = 512
TRACES = {"conversation": "conversation_trace.jsonl", "synthetic": "synthetic_trace.jsonl"}
POLICIES = ("round_robin", "least_loaded", "cache_aware", "cache_aware+L4")


def load_trace(name: str) -> list[dict]:
    path = REPO.parent / "shared" / "data" / "mooncake_traces" / TRACES[name]
    if not path.is_file():
        raise SystemExit(f"trace not found: {path} (the shared data folder ../shared/data)")
    return [json.loads(line) for line in path.open()]


class LRUPool:
    """A replica's pool of blocks, least recently used evicted first."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def prefix_hits(self, ids: list[int]) -> int:
        n = 0
        for b in ids:
            if b not in self.blocks:
                break
            n += 1
        return n

    def touch(self, ids: list[int]) -> tuple[list[int], list[int]]:
        """Use ``ids`` (all now resident); returns (stored, evicted) block ids."""
        stored, evicted = [], []
        for b in ids:
            if b in self.blocks:
                self.blocks.move_to_end(b)
            else:
                self.blocks[b] = None
                stored.append(b)
        while len(self.blocks) > self.capacity:
            old, _ = self.blocks.popitem(last=False)
            evicted.append(old)
        return stored, evicted


def key(b: int) -> bytes:
    return b.to_bytes(8, "big")


def simulate(reqs: list[dict], policy: str, n: int, args: argparse.Namespace) -> dict:
    rate, load_rate = args.prefill_tok_s, args.load_tok_s
    total_tokens = sum(r["input_length"] for r in reqs)
    span = (reqs[-1]["timestamp"] - reqs[0]["timestamp"]) / 1000.0
    # scale arrivals: offered cold prefill work = util x cluster capacity
    scale = (total_tokens / (n * rate * args.util)) / span
    pools = [LRUPool(args.pool_blocks) for _ in range(n)]
    backlog = [0.0] * n  # seconds of queued work
    index = PageIndex(max_pages=1 << 22, approx_ttl_s=1e12)
    pol = Policy()
    l4: OrderedDict[int, None] = OrderedDict()
    t_last = 0.0
    ttft, imbalance = [], []
    cached = l4_tokens = 0
    rr = 0
    for r in reqs:
        t = r["timestamp"] / 1000.0 * scale
        dt = t - t_last
        t_last = t
        backlog = [max(0.0, w - dt) for w in backlog]
        ids, length = r["hash_ids"], r["input_length"]
        limit = max(0, (length - 1) // BLOCK)
        queued = [w * rate for w in backlog]
        if policy == "round_robin":
            i, rr = rr % n, rr + 1
        elif policy == "least_loaded":
            i = min(range(n), key=lambda j: (backlog[j], (j - rr) % n))
            rr += 1
        else:
            hashes = [key(b) for b in ids[:limit]]
            match = index.match(hashes, range(n), now=0.0)
            loads = [ReplicaLoad(queued_tokens=int(q)) for q in queued]
            d = pol.choose(length, {j: m * BLOCK for j, m in match.items()}, loads, now=0.0)
            assert d is not None
            i = d.replica
        hit = min(pools[i].prefix_hits(ids), limit)
        from_l4 = 0
        if policy == "cache_aware+L4":
            for b in ids[hit:limit]:
                if b not in l4:
                    break
                from_l4 += 1
        uncached = length - (hit + from_l4) * BLOCK
        work = uncached / rate + from_l4 * BLOCK / load_rate
        ttft.append(backlog[i] + work)
        backlog[i] += work
        mean_q = statistics.fmean(queued)
        if mean_q > 0:
            imbalance.append(max(queued) / mean_q)
        cached += hit * BLOCK
        l4_tokens += from_l4 * BLOCK
        stored, evicted = pools[i].touch(ids)
        if policy.startswith("cache_aware"):
            index.stored(i, [key(b) for b in stored])
            index.removed(i, [key(b) for b in evicted])
        if policy == "cache_aware+L4":
            for b in ids:
                l4[b] = None
                l4.move_to_end(b)
            while len(l4) > args.l4_blocks:
                l4.popitem(last=False)
    ttft.sort()
    return {"policy": policy, "replicas": n,
            "hit_rate": (cached + l4_tokens) / total_tokens,
            "pool_hit_rate": cached / total_tokens, "l4_hit_rate": l4_tokens / total_tokens,
            "imbalance_mean": statistics.fmean(imbalance) if imbalance else 1.0,
            "ttft_p50_s": ttft[len(ttft) // 2], "ttft_p99_s": ttft[int(len(ttft) * 0.99)],
            "ttft_mean_s": statistics.fmean(ttft)}


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for pol in POLICIES:
        rs = [r for r in rows if r["policy"] == pol]
        ns = [r["replicas"] for r in rs]
        axes[0].plot(ns, [100 * r["hit_rate"] for r in rs], marker="o", label=pol)
        axes[1].plot(ns, [r["imbalance_mean"] for r in rs], marker="o", label=pol)
        axes[2].plot(ns, [r["ttft_p99_s"] for r in rs], marker="o", label=pol)
    for ax, ylabel in zip(axes, ("hit rate (% of prompt tokens)",
                                 "load imbalance (max/mean queued tokens)",
                                 "estimated TTFT p99 (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("replicas")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend(loc="center right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_md(data: dict, path: Path, trace: str) -> None:
    """The results table (markdown) of one trace."""
    st = data["settings"]
    lines = [f"# Offline routing replay: Mooncake `{trace}` trace", "",
             f"Per replica an LRU pool of {st['pool_blocks']} blocks of 512 tokens; prefill "
             f"{st['prefill_tok_s']:.0f} tok/s, shared-tier loads {st['load_tok_s']:.0f} "
             f"tok/s; arrivals scaled to {st['util']:.0%} of the cluster's cold prefill "
             f"capacity; shared tier bounded at {st['l4_blocks']} blocks. Produced by "
             "`scripts/bench_router_sim.py` (deterministic: one run per cell).", "",
             "| replicas | policy | hit rate | of which shared tier | imbalance (max/mean "
             "queued) | TTFT p50 (s) | TTFT p99 (s) |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['replicas']} | {r['policy']} | {100 * r['hit_rate']:.1f}% | "
                     f"{100 * r['l4_hit_rate']:.1f}% | {r['imbalance_mean']:.2f} | "
                     f"{r['ttft_p50_s']:.1f} | {r['ttft_p99_s']:.1f} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", choices=sorted(TRACES), default="conversation")
    p.add_argument("--replicas", type=int, nargs="+", default=[4, 8, 16, 32])
    p.add_argument("--pool-blocks", type=int, default=4000)
    p.add_argument("--l4-blocks", type=int, default=400_000)
    p.add_argument("--prefill-tok-s", type=float, default=602.0)
    p.add_argument("--load-tok-s", type=float, default=6020.0)
    p.add_argument("--util", type=float, default=0.7)
    p.add_argument("--limit", type=int, default=None, help="first N requests only")
    p.add_argument("--out", default=str(REPO / "benchmarks" / "router" / "raw"))
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the markdown and plot from the saved JSON")
    args = p.parse_args()
    out = Path(args.out)
    stem = f"offline_{args.trace}"
    if args.report_only:
        data = json.loads((out / f"{stem}.json").read_text())
        write_md(data, out / f"{stem}.md", args.trace)
        n_req = data["settings"].get("limit") or len(load_trace(args.trace))
        plot(data["rows"], out / f"{stem}.png", _title(args.trace, n_req, data["settings"]))
        return 0
    reqs = load_trace(args.trace)[:args.limit]
    rows = []
    for n in args.replicas:
        for pol in POLICIES:
            t0 = time.perf_counter()
            row = simulate(reqs, pol, n, args)
            row["sim_s"] = round(time.perf_counter() - t0, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "report_only")}
    data = {"settings": settings, "rows": rows}
    (out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    write_md(data, out / f"{stem}.md", args.trace)
    plot(rows, out / f"{stem}.png", _title(args.trace, len(reqs), settings))
    return 0


def _title(trace: str, n_req: int, st: dict) -> str:
    return (f"Mooncake {trace} trace ({n_req} requests), {st['pool_blocks']}-block LRU pool "
            f"per replica, load {st['util']:.0%} of cold capacity")


if __name__ == "__main__":
    sys.exit(main())
