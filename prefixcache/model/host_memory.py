"""Keep freed activation memory in the process heap (glibc), so a step's large
temporaries reuse pages instead of faulting fresh ones in.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (128 KiB at start, raised
dynamically) with ``mmap`` and returns them with ``munmap``: every step's activations
(a 2,048-token prefill of SmolLM2-135M allocates tensors of 2-25 MB per layer) were
new pages, 286,000-366,000 minor page faults per prefill step. With the mmap threshold at
glibc's maximum (32 MiB on 64-bit) and trimming off, they come from the heap and are
reused: 0 faults per step, and the 2k prefill step 1.09-1.12x faster (measured on the
project's machine, 1 thread, ``benchmarks/speed/analysis.md``). The memory a step peaked
at stays with the process (as PyTorch's CUDA caching allocator keeps it on a GPU).

``PREFIXCACHE_KEEP_HEAP=0`` leaves glibc's defaults. Not glibc (musl, macOS): a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: never trim below 2 GiB free

_lock = threading.Lock()
_done: bool | None = None


def keep_freed_memory() -> bool:
    """Set glibc's thresholds once per process; ``True`` when they are set (now or
    before), ``False`` when disabled or not glibc."""
    global _done
    with _lock:
        if _done is not None:
            return _done
        _done = False
        if os.environ.get("PREFIXCACHE_KEEP_HEAP", "1") == "0":
            return False
        name = ctypes.util.find_library("c")
        try:
            libc = ctypes.CDLL(name or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):
            return False
        mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        mallopt.restype = ctypes.c_int
        ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1
        ok = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        _done = ok
        return ok
