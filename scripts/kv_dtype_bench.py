"""KV cache dtype: tokens of KV at equal bytes, resident memory, TPOT and greedy agreement.

For each ``--kv-cache-dtype`` (float32, bfloat16, int8), loads ``--model`` with the same
``--kv-cache-gib`` and reports the pool's pages and tokens, its bytes, the process's resident
memory after start, the TPOT of one greedy request (``--prompt-tokens`` in, ``--max-tokens``
out, median of ``--rounds``), and the share of greedy tokens equal to the float32 pool's run
(same prompts). Figures go to ``benchmarks/quantized/RESULTS.md``::

    python scripts/kv_dtype_bench.py --model smollm2-135m-instruct-q4_1 --num-threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from prefixcache import LLM, SamplingParams


def prompts(n: int, length: int) -> list[list[int]]:
    return [[1] + [(37 * i + 101 * j) % 20000 + 50 for i in range(length - 1)]
            for j in range(n)]


def measure(args: argparse.Namespace, kv_dtype: str) -> dict:
    """One KV dtype, in this (fresh) process."""
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    work = prompts(args.agreement_prompts, args.prompt_tokens)
    llm = LLM(args.model, kv_cache_dtype=kv_dtype, num_threads=args.num_threads,
              kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)))
    rss_start = resident_mib()
    kv = llm.engine.runner.kv
    tpots = []
    for r in range(args.rounds):
        prompt = [2 + r] + work[0][1:]  # a cold prompt each round
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], greedy)[0]
        total = time.perf_counter() - t0
        tpots.append((total - (out.ttft or 0.0)) / (args.max_tokens - 1) * 1e3)
    outs = [o.outputs[0].token_ids
            for o in llm.generate([{"prompt_token_ids": w} for w in work], greedy)]
    return {"kv_dtype": kv_dtype, "pages": kv.num_pages, "tokens": kv.num_pages * kv.block_size,
            "pool_mib": sum(t.numel() * t.element_size() for t in kv.k + kv.v) / 2**20,
            "rss_start_mib": rss_start, "tpot_ms": tpots, "greedy": outs}


def resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct-q4_1")
    p.add_argument("--kv-cache-gib", type=float, default=0.25)
    p.add_argument("--num-threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--agreement-prompts", type=int, default=4)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args, args.one)))
        return
    print("| KV dtype | pages | KV tokens | pool MiB | RSS after start MiB | TPOT ms median "
          "(min-max) | greedy tokens = float32 |")
    print("|---|---|---|---|---|---|---|")
    ref = None
    for kv_dtype in ("float32", "bfloat16", "int8"):
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--one", kv_dtype],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        ref = ref or r["greedy"]
        same = sum(a == b for x, y in zip(r["greedy"], ref) for a, b in zip(x, y))
        t = r["tpot_ms"]
        print(f"| {kv_dtype} | {r['pages']} | {r['tokens']:,} | {r['pool_mib']:.0f} | "
              f"{r['rss_start_mib']:.0f} | {statistics.median(t):.1f} ({min(t):.1f}-"
              f"{max(t):.1f}) | {same}/{sum(map(len, ref))} |", flush=True)


if __name__ == "__main__":
    main()
