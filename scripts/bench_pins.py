"""Pins and tenant quotas under a flood: what a pinned system prompt and a quota keep.

Two experiments on ``builtin:tiny`` (CPU, a pool of 64 pages of 16 tokens), each run
side by side (two engines, rounds interleaved A/B) and repeated:

1. **Pin vs no pin.** A 512-token system prompt (32 pages) is pre-stored
   (``max_tokens=0``), pinned or not; each round, 6 cold 256-token prompts (96 pages,
   1.5x the pool) pass through, then one request with the system prompt and a new
   question. Reported: its ``cached_tokens``, the prefill tokens the engine computed for
   it (a work count) and its TTFT.
2. **Quota vs none.** Tenant ``b`` pre-stores a 384-token document (24 pages); tenant
   ``a`` floods with 6 cold prompts per round; then ``b`` asks about its document.
   With ``tenant_quota_fraction=0.5`` against none.

    python scripts/bench_pins.py --rounds 6 --out benchmarks/pins/raw
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from prefixcache import LLM, SamplingParams

BS, POOL = 16, 64
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def toks(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + t * 31) % 250 + 3 for t in range(n)]


def make(**kw) -> LLM:
    return LLM("builtin:tiny", num_pages=POOL, block_size=BS, max_model_len=1024,
               num_threads=1, **kw)


def ask(llm: LLM, prompt: list[int], tenant: str | None = None) -> dict:
    before = llm.stats()["prefill_tokens_computed"]
    out = llm.generate({"prompt_token_ids": prompt}, ONE, tenant=tenant)[0]
    return {"cached_tokens": out.num_cached_tokens,
            "prefill_computed": llm.stats()["prefill_tokens_computed"] - before,
            "ttft_ms": 1000 * (out.ttft or 0.0)}


def flood(llm: LLM, round_: int, tenant: str | None = None) -> None:
    for j in range(6):
        llm.generate({"prompt_token_ids": toks(1000 + 10 * round_ + j, 256)}, ONE,
                     tenant=tenant)


def pin_experiment(rounds: int) -> dict:
    system = toks(1, 512)
    arms = {"pinned": make(), "unpinned": make()}
    arms["pinned"].pin_prefix({"prompt_token_ids": system}, ttl_s=3600)
    arms["unpinned"].generate({"prompt_token_ids": system}, SamplingParams(max_tokens=0))
    rows: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in (("pinned", "unpinned") if r % 2 == 0 else ("unpinned", "pinned")):
            llm = arms[name]
            flood(llm, r)
            rows[name].append(ask(llm, system + toks(500 + r, 16)))
    return {k: {"rows": v, "evictions": arms[k].stats()["evictions"]} for k, v in rows.items()}


def quota_experiment(rounds: int) -> dict:
    doc = toks(2, 384)
    arms = {"quota 0.5": make(tenant_quota_fraction=0.5), "no quota": make()}
    for llm in arms.values():
        llm.generate({"prompt_token_ids": doc}, SamplingParams(max_tokens=0), tenant="b")
    rows: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in (list(arms) if r % 2 == 0 else list(arms)[::-1]):
            llm = arms[name]
            flood(llm, r, tenant="a")
            rows[name].append(ask(llm, doc + toks(600 + r, 16), tenant="b"))
    return {k: {"rows": v, "evictions": arms[k].stats()["evictions"]} for k, v in rows.items()}


def summary(rows: list[dict]) -> dict:
    """Medians and ranges (min..max) over rounds; round 0 (warm-up) is left out."""
    kept = rows[1:] or rows
    out = {}
    for key in ("cached_tokens", "prefill_computed", "ttft_ms"):
        vals = [r[key] for r in kept]
        out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (title, exp) in zip(axes, results["experiments"].items()):
        names = list(exp)
        med = [exp[n]["summary"]["ttft_ms"]["median"] for n in names]
        lo = [m - exp[n]["summary"]["ttft_ms"]["min"] for n, m in zip(names, med)]
        hi = [exp[n]["summary"]["ttft_ms"]["max"] - m for n, m in zip(names, med)]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=["#4c72b0", "#dd8452"])
        for i, n in enumerate(names):
            ax.text(i, med[i], f"{exp[n]['summary']['cached_tokens']['median']:.0f} cached",
                    ha="center", va="bottom")
        ax.set_title(title)
        ax.set_ylabel("TTFT, ms (median, min..max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/pins/raw"))
    args = ap.parse_args()
    exps = {"system prompt after a flood": pin_experiment(args.rounds),
            "tenant b's document after a's flood": quota_experiment(args.rounds)}
    for exp in exps.values():
        for arm in exp.values():
            arm["summary"] = summary(arm["rows"])
    results = {"model": "builtin:tiny", "block_size": BS, "num_pages": POOL,
               "rounds": args.rounds, "experiments": exps}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    plot(results, args.out / "pins_quota_ttft.png")
    lines = ["| experiment | arm | cached tokens | prefill tokens computed | TTFT ms "
             "(median, min..max) | evictions |", "|---|---|---|---|---|---|"]
    for title, exp in exps.items():
        for name, arm in exp.items():
            s = arm["summary"]
            t = s["ttft_ms"]
            lines.append(f"| {title} | {name} | {s['cached_tokens']['median']:.0f} | "
                         f"{s['prefill_computed']['median']:.0f} | {t['median']:.1f} "
                         f"({t['min']:.1f}..{t['max']:.1f}) | {arm['evictions']} |")
    print("\n".join(lines))



if __name__ == "__main__":
    main()
