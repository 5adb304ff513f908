"""TTL pins across the KV tiers: what a pinned system prompt keeps when a flood needs the
whole pool (so even pinned pages are evicted).

``builtin:tiny`` on CPU, a pool of 64 pages of 16 tokens. A 512-token system prompt
(32 pages) is pre-stored; each round a 1,000-token prompt (63 pages: the whole pool but
one) and eight cold 256-token prompts pass through, then one request with the system prompt
and a new question. Three engines, rounds interleaved (the order rotates), repeated:

- ``pin + host``: pinned, with a 96-page host-RAM tier (its pin cap: 48 pages);
- ``no pin + host``: not pinned, same tier;
- ``pin, no tier``: pinned, no tier (its pin lapses when the flood evicts its pages).

Reported per round: the tier ``list_pins`` shows before the request, its
``cached_tokens``, the tokens loaded from host RAM, the prefill tokens computed (work
counts), and its TTFT.

    python scripts/bench_pin_tiers.py --rounds 6 --out benchmarks/tiers/raw/pin_tiers
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
from pathlib import Path

from prefixcache import LLM, SamplingParams

BS, POOL, PAGE = 16, 64, 64 * 1024  # PAGE: bytes of one builtin:tiny page (float32)
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def toks(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)  # no two seeds share a start (a shared start would hit)
    return [rng.randrange(3, 253) for _ in range(n)]


def make(**kw) -> LLM:
    return LLM("builtin:tiny", num_pages=POOL, block_size=BS, max_model_len=1024,
               num_threads=1, tier_load_policy="always", **kw)


def ask(llm: LLM, prompt: list[int]) -> dict:
    before = llm.stats()
    pins = llm.list_pins()
    out = llm.generate({"prompt_token_ids": prompt}, ONE)[0]
    after = llm.stats()
    return {"tier_before": pins[0]["tier"] if pins else None,
            "cached_tokens": out.num_cached_tokens,
            "host_hit_tokens": after.get("host_tier_hit_tokens", 0)
            - before.get("host_tier_hit_tokens", 0),
            "prefill_computed": after["prefill_tokens_computed"]
            - before["prefill_tokens_computed"],
            "ttft_ms": 1000 * (out.ttft or 0.0)}


def flood(llm: LLM, round_: int) -> None:
    llm.generate({"prompt_token_ids": toks(9000 + round_, 1000)}, ONE)
    for j in range(8):
        llm.generate({"prompt_token_ids": toks(1000 + 10 * round_ + j, 256)}, ONE)
    if llm.engine.tiers is not None:
        llm.engine.tiers.flush()


def run(rounds: int) -> dict:
    system = toks(1, 512)
    arms = {"pin + host": make(host_cache_bytes=96 * PAGE),
            "no pin + host": make(host_cache_bytes=96 * PAGE),
            "pin, no tier": make()}
    for name, llm in arms.items():
        if name.startswith("pin"):
            llm.pin_prefix({"prompt_token_ids": system}, ttl_s=3600)
        else:
            llm.generate({"prompt_token_ids": system}, SamplingParams(max_tokens=0))
    names = list(arms)
    rows: dict[str, list[dict]] = {k: [] for k in arms}
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            llm = arms[name]
            flood(llm, r)
            rows[name].append(ask(llm, system + toks(500 + r, 16)))
    keys = ("evictions", "pin_pages_demoted", "pin_pages_reloaded", "pins_evicted",
            "host_tier_evictions", "host_tier_pinned_evictions", "host_tier_pinned_bytes")
    return {k: {"rows": v, "stats": {s: arms[k].stats().get(s) for s in keys}}
            for k, v in rows.items()}


def summary(rows: list[dict]) -> dict:
    """Medians and ranges (min..max) over rounds; round 0 (warm-up) is left out."""
    kept = rows[1:] or rows
    out: dict = {"tier_before": sorted({str(r["tier_before"]) for r in kept})}
    for key in ("cached_tokens", "host_hit_tokens", "prefill_computed", "ttft_ms"):
        vals = [r[key] for r in kept]
        out[key] = {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/tiers/raw/pin_tiers"))
    args = ap.parse_args()
    arms = run(args.rounds)
    for arm in arms.values():
        arm["summary"] = summary(arm["rows"])
    results = {"model": "builtin:tiny", "block_size": BS, "num_pages": POOL,
               "host_tier_pages": 96, "rounds": args.rounds, "arms": arms}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = ["| arm | pin's tier before | cached tokens | from host RAM | prefill computed "
             "| TTFT ms (median, min..max) |", "|---|---|---|---|---|---|"]
    for name, arm in arms.items():
        s, t = arm["summary"], arm["summary"]["ttft_ms"]
        lines.append(f"| {name} | {', '.join(s['tier_before'])} | "
                     f"{s['cached_tokens']['median']:.0f} | "
                     f"{s['host_hit_tokens']['median']:.0f} | "
                     f"{s['prefill_computed']['median']:.0f} | {t['median']:.1f} "
                     f"({t['min']:.1f}..{t['max']:.1f}) |")
    print("\n".join(lines))
    for name, arm in arms.items():
        print(name, arm["stats"])


if __name__ == "__main__":
    main()
