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
x = torch.empty(5 * 1024 * 1024)                  # the process's first 20 MiB block
addr = x.data_ptr()
heap = [l for l in open("/proc/self/maps") if l.rstrip().endswith("[heap]")]
lo, hi = (int(v, 16) for v in heap[0].split()[0].split("-")) if heap else (0, 0)
del x
MIB = 1024 * 1024 // 4
def cycle():  # a step's activations: sizes of 2-12 MiB alive at once, then freed
    xs = [torch.empty(n * MIB) for n in (6, 12, 2, 12, 8, 12, 4, 12, 10, 12)]
    for x in xs:
        x.fill_(1.0)                   # touch every page
    del xs
for _ in range(5):  # past glibc's warm-up
    cycle()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    cycle()
print(int(set_), int(lo <= addr < hi), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
"""


def probe(keep: bool) -> tuple[int, int, int]:
    """(thresholds set, first 20 MiB block inside [heap], page faults of 5 steady cycles)"""
    out = subprocess.run([sys.executable, "-c", PROBE, "1" if keep else "0"], check=True,
                         capture_output=True, text=True).stdout.split()
    return int(out[0]), int(out[1]), int(out[2])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt only")
def test_large_temporaries_come_from_the_heap_and_reuse_its_pages():
    set_, in_heap, faults = probe(True)
    assert set_ == 1 and in_heap == 1
    assert faults <= 5 * 90 * 1024 * 1024 // 4096 * 0.02   # the same pages again
    # glibc's default serves the first 20 MiB block with mmap, outside the heap
    assert probe(False)[:2] == (0, 0)


def test_opt_out_leaves_the_defaults(monkeypatch):
    from prefixcache.model import host_memory

    monkeypatch.setenv("PREFIXCACHE_KEEP_HEAP", "0")
    monkeypatch.setattr(host_memory, "_done", None)
    assert host_memory.keep_freed_memory() is False
    monkeypatch.setattr(host_memory, "_done", None)  # leave the next caller a fresh state
