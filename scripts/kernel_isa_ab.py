"""Whole model steps with the CPU kernels against torch ops only, the kernels built for this
CPU or for AVX2 only: how they run on a CPU without AVX-512, measured on one that has it
(benchmarks/decode/RESULTS.md).

    python scripts/kernel_isa_ab.py MODEL_DIR [--avx2] [--repeats 5]

Paired rounds in one process, one thread (:func:`prefixcache.bench.decode_perf.cpu_kernels_ab`):
decode steps of 1 sequence at 512 tokens and 4 at 1,024, prefill steps of 2,048 cold tokens
and of 64 new tokens over 1,984 cached. ``--avx2`` builds the kernels with
``-march=x86-64-v3`` (AVX2 and FMA, no AVX-512) into a build directory of their own (the
flags are part of its name); cap torch's own kernels too with ``ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""
from __future__ import annotations

import argparse

import torch

from prefixcache.bench import decode_perf
from prefixcache.model.cpu.kernels import build
from prefixcache.model.loader import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--avx2", action="store_true", help="build the kernels for AVX2 only")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.avx2:
        build.CFLAGS[:] = ["-O3", "-march=x86-64-v3", "-mtune=native", "-fopenmp-simd",
                           "-ffast-math"]
    torch.set_num_threads(1)
    # the A/B runs it on the CPU backend with and without the kernels
    model = load_model(args.model, "cpu", torch.float32, compute_backend="cpu-kernels").model
    rows = decode_perf.cpu_kernels_ab(model, repeats=args.repeats)
    if not rows:
        raise SystemExit(f"the CPU kernels did not build: {build.failure()}")
    print(f"build: {' '.join(build.CFLAGS)}; torch: {torch.backends.cpu.get_cpu_capability()}")
    print("| step | kernels (ms) | torch ops (ms) | torch ops / kernels (min-max) |")
    print("|---|---|---|---|")
    for r in rows:
        step = (f"decode {r['seqs']} x {r['ctx']}" if "seqs" in r
                else f"prefill {r['new']} over {r['ctx'] - r['new']}")
        k, t, q = r["kernels"], r["torch_ops"], r["ratio"]
        print(f"| {step} | {k['median'] * 1e3:.1f} | {t['median'] * 1e3:.1f} | "
              f"{q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f}) |")


if __name__ == "__main__":
    main()
