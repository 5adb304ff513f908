"""Combine repeated side-by-side serving runs (``prefixcache bench --peers P`` once per
peer and round, rounds alternating which peer goes first) into one table: per workload,
each metric's median over rounds for both peers and the per-round ratio (median, min-max).

    python scripts/serving_rounds.py --ours prefixcache --peer vllm \\
        --out benchmarks/serving/raw/ROUNDS.md DIR [DIR ...]

Each ``DIR`` holds one run's ``results.jsonl`` (its peer and round are read from it and
from the directory name, ``r<round>-<peer>``).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

# (key, label, better): "higher" or "lower"
METRICS = [("requests_per_s", "req/s", "higher"), ("ttft_p50_s", "TTFT p50 (s)", "lower"),
           ("ttft_p99_s", "TTFT p99 (s)", "lower"), ("tpot_p50_s", "TPOT p50 (s)", "lower"),
           ("hit_rate", "hit rate", "higher")]


def load(dirs: list[Path]) -> dict:
    """``{(round, peer, workload): summary}``; round from ``r<N>-...`` names."""
    runs = {}
    for d in dirs:
        rnd = int(d.name.split("-")[0].lstrip("r"))
        for line in (d / "results.jsonl").read_text().splitlines():
            s = json.loads(line)
            if s.get("mode") == "serving":
                runs[(rnd, s["peer"], s["workload"])] = s
    return runs


def _numbers(v) -> list[float]:
    if isinstance(v, (int, float)):
        return [float(v)]
    return [float(x) for x in v] if isinstance(v, list) else []


def table(runs: dict, ours: str, peer: str) -> str:
    rounds = sorted({r for r, _, _ in runs})
    workloads = sorted({w for _, _, w in runs})
    loads = [x for s in runs.values() for x in _numbers(s.get("load_average_1m"))]
    out = [f"{len(rounds)} rounds; each cell: median over rounds (min-max). Ratio: {ours} "
           f"over {peer} per round for req/s and hit rate, {peer} over {ours} for times "
           "(above 1: ours is better).", ""]
    if loads:
        out.append(f"1-minute load average during the runs: {min(loads):.1f}-{max(loads):.1f}")
        out.append("")
    out.append(f"| workload | metric | {ours} | {peer} | ratio (median, min-max) | "
               "rounds ours better |")
    out.append("|---|---|---|---|---|---|")
    fmt = lambda v: f"{v:.3g}"  # noqa: E731
    for w in workloads:
        for key, label, better in METRICS:
            a = [runs[(r, ours, w)][key] for r in rounds if (r, ours, w) in runs]
            b = [runs[(r, peer, w)][key] for r in rounds if (r, peer, w) in runs]
            pairs = [(runs[(r, ours, w)][key], runs[(r, peer, w)][key]) for r in rounds
                     if (r, ours, w) in runs and (r, peer, w) in runs]
            if not pairs:
                continue
            ratio = [x / y if better == "higher" else y / x for x, y in pairs if x and y]
            wins = sum(1 for q in ratio if q >= 1.0)
            cell = lambda v: (f"{fmt(statistics.median(v))} ({fmt(min(v))}-{fmt(max(v))})"  # noqa: E731
                              if v else "-")
            out.append(f"| {w} | {label} | {cell(a)} | {cell(b)} | "
                       f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}) | "
                       f"{wins}/{len(ratio)} |")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--ours", default="prefixcache")
    ap.add_argument("--peer", default="vllm")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    text = table(load(a.dirs), a.ours, a.peer)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
