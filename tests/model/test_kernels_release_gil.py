"""The CPU kernels run without the GIL: while an engine thread is inside one (a prefill
attention call lasts tens of milliseconds), other Python threads (a server's HTTP thread)
keep running."""
from __future__ import annotations

import threading
import time

import torch

from prefixcache.model.cpu.kernels import paged_decode, paged_prefill
from tests.helpers.kernels import built_or_skip


def python_ran_inside(call) -> tuple[int, float]:
    """Run ``call`` on a worker thread while this thread keeps taking timestamps; returns
    how many of them fall in the middle half of the call, and the call's length (s)."""
    span: list[float] = []
    stamps: list[float] = []
    started = threading.Event()

    def worker():
        started.set()
        t0 = time.perf_counter()
        call()
        span.extend([t0, time.perf_counter()])

    th = threading.Thread(target=worker)
    th.start()
    started.wait()
    while th.is_alive():
        stamps.append(time.perf_counter())
    th.join()
    t0, t1 = span
    lo, hi = t0 + (t1 - t0) / 4, t1 - (t1 - t0) / 4
    return sum(lo <= s <= hi for s in stamps), t1 - t0


def sized(make, min_s: float = 0.03):
    """The first call built by ``make(scale)`` (scale 1, 2, 4, ...) lasting ``min_s`` or
    more, so the middle half of it is far longer than a GIL switch interval."""
    scale = 1
    while True:
        call = make(scale)
        t = time.perf_counter()
        call()
        if time.perf_counter() - t >= min_s or scale >= 64:
            return call
        scale *= 2


def test_prefill_kernel_lets_python_threads_run():
    mod = built_or_skip(paged_prefill, "prefill")

    def make(scale):
        n, kvh, d, bs = 512 * scale, 4, 64, 16
        pages = n // bs
        k = torch.randn(pages, bs, kvh, d)
        v = torch.randn(pages, bs, kvh, d)
        q = torch.randn(n, 8, d)
        table = torch.arange(pages)
        return lambda: mod.paged_prefill(q, k, v, table, 0, d ** -0.5)

    inside, length = python_ran_inside(sized(make))
    assert inside > 0, f"no Python ran during a {length * 1e3:.0f} ms kernel call"


def test_decode_kernel_lets_python_threads_run():
    mod = built_or_skip(paged_decode, "decode")

    def make(scale):
        rows, ctx, kvh, d, bs = 16, 1024 * scale, 4, 64, 16
        pages = ctx // bs
        k = torch.randn(pages, bs, kvh, d)
        v = torch.randn(pages, bs, kvh, d)
        q = torch.randn(rows, 8, d)
        table = torch.arange(pages).repeat(rows, 1)
        lens = torch.full((rows,), ctx)
        return lambda: mod.paged_decode(q, k, v, table, lens, None, d ** -0.5)

    inside, length = python_ran_inside(sized(make))
    assert inside > 0, f"no Python ran during a {length * 1e3:.0f} ms kernel call"
