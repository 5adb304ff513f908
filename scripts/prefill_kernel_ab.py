"""A/B of the CPU paged prefill kernel at two git revisions, interleaved in one process.

Each revision's CPU kernels (the files of ``build.SOURCES`` and ``build.HEADERS`` as they
were then) are built as a module of their own with the project's flags, and its
``paged_prefill`` is called on the same pool, page table and queries, one
after the other, ``--repeats`` times; the table gives each one's median time and its
effective GFLOP/s (4 * score elements * head_dim * heads), and whether both returned the
same bits.

    python scripts/prefill_kernel_ab.py 5cd0bbb HEAD --threads 1

Cases: ``heads/kv_heads n first`` (a chunk of n queries after ``first`` cached keys),
block size 16, head_dim 64, pages in random order.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

from prefixcache.model.cpu.kernels.build import CFLAGS, HEADERS, SOURCES

CASES = [(8, 4, 2048, 0), (9, 3, 2048, 0), (8, 8, 2048, 0), (8, 1, 2048, 0),
         (8, 4, 64, 1984), (9, 3, 64, 1984), (8, 4, 512, 1536), (9, 3, 1024, 3072)]


def build(rev: str, root: Path):
    """The CPU kernels of ``rev`` as a module of its own."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    d = root / sha
    d.mkdir(parents=True, exist_ok=True)
    for f in (*SOURCES, *HEADERS):
        for where in ("prefixcache/model/cpu/kernels", "prefixcache/model/kernels"):  # moved
            got = subprocess.run(["git", "show", f"{rev}:{where}/{f.name}"],
                                 capture_output=True, text=True)
            if got.returncode == 0:
                break
        else:
            raise SystemExit(f"{rev}: no kernel source {f.name}")
        (d / f.name).write_text(got.stdout)
    return sha, cpp_extension.load(name=f"prefill_ab_{sha}",
                                   sources=[str(d / f.name) for f in SOURCES],
                                   extra_cflags=CFLAGS, build_directory=str(d), verbose=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("revs", nargs=2, help="two git revisions (A, then B)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        mods = [build(r, Path(tmp)) for r in args.revs]
        names = " | ".join(f"{s} ms | {s} GFLOP/s" for s, _ in mods)
        print(f"| heads/kv n first | {names} | same bits |")
        print("|---" * (2 + 2 * len(mods)) + "|")
        for heads, kvh, n, first in CASES:
            d, bs = 64, 16
            ctx = first + n
            pool = ctx // bs + 8
            g = torch.Generator().manual_seed(heads * 100 + n + first)
            k = torch.randn(pool, bs, kvh, d, generator=g)
            v = torch.randn(pool, bs, kvh, d, generator=g)
            table = torch.randperm(pool, generator=g)[:-(-ctx // bs)].contiguous()
            q = torch.randn(n, heads, d, generator=g)
            outs = [torch.empty(n, heads, d) for _ in mods]
            times: list[list[float]] = [[] for _ in mods]
            for _ in range(args.repeats + 1):
                for i, (_, mod) in enumerate(mods):
                    t = time.perf_counter()
                    mod.paged_prefill(q, k, v, table, first, outs[i], d ** -0.5)
                    times[i].append(time.perf_counter() - t)
            gflop = 4 * (n * first + n * (n + 1) / 2) * d * heads / 1e9
            cells = " | ".join(f"{statistics.median(t[1:]) * 1e3:.2f} | "
                               f"{gflop / statistics.median(t[1:]):.0f}" for t in times)
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            print(f"| {heads}/{kvh} {n} {first} | {cells} | {'yes' if same else 'no'} |")


if __name__ == "__main__":
    main()
