"""Freed activation memory stays in the heap: a step's large temporaries reuse pages
instead of faulting in fresh ones (glibc only)."""
from __future__ import annotations

import platform
import subprocess
import sys

import pytest

PROBE = r"""
import resource, sys, torch
from prefixcache.model import host_memory
set_ = host_memory.keep_freed_memory() if sys.argv[1] == "1" else False
MIB = 1024 * 1024 // 4
def cycle():  # a step's activations: several sizes of 2-25 MiB alive at once, then freed
    xs = [torch.empty(n * MIB) for n in (6, 25, 2, 12, 18)]
    for x in xs:
        x.fill_(1.0)                   # touch every page
    del xs
cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(int(set_), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def faults(keep: bool) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if keep else "0"], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_large_temporaries_reuse_heap_pages():
    set_, kept = faults(True)
    assert set_ == 1
    _, default = faults(False)
    pages = 5 * 63 * 1024 * 1024 // 4096
    assert default >= pages * 0.2   # glibc's default: cycles map fresh pages (25-100%)
    assert kept <= pages * 0.06     # kept: the same pages again (0-6% measured)


def test_opt_out_leaves_the_defaults(monkeypatch):
    from prefixcache.model import host_memory

    monkeypatch.setenv("PREFIXCACHE_KEEP_HEAP", "0")
    monkeypatch.setattr(host_memory, "_done", None)
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", None)  # leave the next caller a fresh state
