"""Cold, warm and TPOT in process on one thread, with the CPU kernels built for this CPU or
for AVX2 only: how the kernels run on a CPU without AVX-512, measured on one that has it
(benchmarks/speed/avx2_kernels/RESULTS.md).

    python scripts/kernel_isa_ab.py MODEL [--avx2] [--repeats 3] [--tag TEXT]

A cold 1,984-token prompt (random ids), the same prompt plus 64 new tokens (warm: 1,984
cached), and 33 greedy tokens after a cached 512-token prompt (TPOT: that call's time over
33, its one-token prefill included); one line with the median (min-max) of each over the
repeats, in ms. ``--avx2`` builds the kernels with ``-march=x86-64-v3`` (AVX2 and FMA, no
AVX-512) into a build directory of their own (the flags are part of its name); cap torch's
own kernels too with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
MKL_ENABLE_INSTRUCTIONS=AVX2``. ``PREFIXCACHE_CPU_KERNELS=1`` or ``0`` chooses kernels or
torch ops (``auto`` would turn them off for an AVX2 build only on an AVX2 CPU).
"""
from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from prefixcache.model.kernels import build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--avx2", action="store_true", help="build the kernels for AVX2 only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if args.avx2:
        build.CFLAGS[:] = ["-O3", "-march=x86-64-v3", "-mtune=native", "-fopenmp-simd",
                           "-ffast-math"]
    torch.set_num_threads(1)
    from prefixcache.engine.llm import LLM
    from prefixcache.sampling_params import SamplingParams

    llm = LLM(model=args.model, enable_prefix_caching=True)
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 20000) for _ in range(n)]

    def timed(prompt: list[int], sp: SamplingParams) -> float:
        t0 = time.perf_counter()
        llm.generate({"prompt_token_ids": prompt}, sp)
        return time.perf_counter() - t0

    one = SamplingParams(max_tokens=1, temperature=0)
    timed(ids(300), one)
    cold, warm, tpot = [], [], []
    for _ in range(args.repeats):
        base = ids(1984)
        cold.append(timed(base, one))
        warm.append(timed(base + ids(64), one))
        p = ids(512)
        timed(p, one)
        tpot.append(timed(p + [7], SamplingParams(max_tokens=33, temperature=0,
                                                  ignore_eos=True)) / 33)

    def fmt(xs: list[float]) -> str:
        return f"{statistics.median(xs) * 1e3:.1f} ms ({min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})"

    print(args.tag, "cold", fmt(cold), "| warm", fmt(warm), "| tpot~", fmt(tpot), flush=True)


if __name__ == "__main__":
    main()
