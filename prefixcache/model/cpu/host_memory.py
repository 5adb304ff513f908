"""Host memory placement: freed activations kept in the process heap (glibc), the
weights on transparent huge pages, and the KV pool resident from its creation.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (128 KiB at start, raised
dynamically) with ``mmap`` and returns them with ``munmap``: every step's activations
(a 2,048-token prefill of SmolLM2-135M allocates tensors of 2-25 MB per layer) were
new pages, hundreds of thousands of minor page faults per prefill step. With the mmap
threshold at glibc's maximum (32 MiB on 64-bit) and trimming off, they come from the heap
and are reused: no faults per step and a faster prefill (figures in
``benchmarks/decode/RESULTS.md``). The memory a step peaked at stays with the process
(as PyTorch's CUDA caching allocator keeps it on a GPU).

``PREFIXCACHE_KEEP_HEAP=0`` leaves glibc's defaults. Not glibc (musl, macOS): a no-op.

Huge pages (:func:`empty`, :class:`HugePageArena`): a one-row decode step reads every
weight once, so with 4 KiB pages it walks about 130,000 pages of weights; Linux backs a
``madvise(MADV_HUGEPAGE)`` range with 2 MiB pages where it can
(``/sys/kernel/mm/transparent_hugepage/enabled`` set to ``always`` or ``madvise``). The
advice is given before the first write, so the pages are huge from their first fault (no
copy). The model's weights come from an arena, and :func:`keep_freed_memory` grows the
main heap by ``HEAP_RESERVE`` and advises it, so the activations of the thread that
loaded the model and oneDNN's packed weights land on huge pages too: fewer TLB misses in
a step that streams every weight (``benchmarks/decode/RESULTS.md`` has the speed-up).
``PREFIXCACHE_HUGE_PAGES=0`` turns all of it off; not
Linux, or not a CPU tensor: plain ``torch.empty``.

The KV pool (:func:`zeros`) is not on huge pages: it is faulted in whole when it is made,
on 4 KiB pages, so no request pays for its first touch.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import threading

import torch

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2**31 - 1  # mallopt takes an int: never trim below 2 GiB free

HUGE_PAGE = 2 * 1024 * 1024  # x86-64 and arm64 (4 KiB base pages) PMD size
MIN_MAPPING_BYTES = 2 * HUGE_PAGE  # a pool tensor below this stays in the heap
CHUNK_BYTES = 64 * 1024 * 1024  # a HugePageArena's mappings
HEAP_RESERVE = 1024 * 1024 * 1024  # heap grown (virtually) and advised at start
HEAP_STEP = 30 * 1024 * 1024  # malloc size that grows it: below the mmap threshold
MADV_HUGEPAGE = 14  # <linux/mman.h>
MADV_NOHUGEPAGE = 15
MADV_POPULATE_WRITE = 23  # <linux/mman.h>, Linux 5.14+

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
        if ok and huge_pages_enabled():
            _advise_heap(libc)
        return ok


def _advise_heap(libc) -> None:
    """Grow the main heap by ``HEAP_RESERVE`` (mallocs of ``HEAP_STEP``, freed again: the
    memory stays with glibc, which does not trim it, and is not faulted in) and advise the
    grown range ``MADV_HUGEPAGE``; nothing where ``sbrk`` is missing or fails. The
    activations of later steps and oneDNN's packed weights are carved from it on huge
    pages. A 2 MiB region that holds one of the freed chunks' headers (written by malloc,
    before the advice) stays on 4 KiB pages."""
    try:
        sbrk, malloc, free, madvise = libc.sbrk, libc.malloc, libc.free, libc.madvise
    except AttributeError:
        return
    sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    madvise.restype, madvise.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t,
                                                        ctypes.c_int]
    before = sbrk(0)
    chunks = [malloc(HEAP_STEP) for _ in range(HEAP_RESERVE // HEAP_STEP)]
    after = sbrk(0)
    for c in chunks:
        free(c)
    lo = -(-(before or 0) // HUGE_PAGE) * HUGE_PAGE
    hi = (after or 0) // HUGE_PAGE * HUGE_PAGE
    if before and hi > lo:
        madvise(lo, hi - lo, MADV_HUGEPAGE)  # advice: a failure leaves plain pages


_LINUX_MMAP = hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")


def huge_pages_enabled() -> bool:
    """Whether an arena's CPU tensors (:func:`empty`) are placed on huge-page-advised
    mappings (Linux, and ``PREFIXCACHE_HUGE_PAGES`` is not ``0``)."""
    return os.environ.get("PREFIXCACHE_HUGE_PAGES", "1") != "0" and _LINUX_MMAP


class _Mapping:
    """A private anonymous mapping of at least ``nbytes`` from a 2 MiB boundary on,
    advised ``MADV_HUGEPAGE`` (``huge``) or ``MADV_NOHUGEPAGE`` (also with THP
    ``always``) before anything is written (its pages are zero until then); tensors made
    by :meth:`tensor` keep it mapped."""

    def __init__(self, nbytes: int, huge: bool = True):
        self.mm = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))
        self.start = -base % HUGE_PAGE  # base is page-aligned, so is this
        self.used = 0
        self.size = nbytes
        length = nbytes // HUGE_PAGE * HUGE_PAGE
        if length:
            try:
                self.mm.madvise(MADV_HUGEPAGE if huge else MADV_NOHUGEPAGE, self.start, length)
            except OSError:  # THP compiled out: plain pages
                pass

    def populate(self) -> bool:
        """Fault every page of the mapping in now, writable (``MADV_POPULATE_WRITE``);
        ``False`` where the kernel does not have it (before 5.14)."""
        try:
            self.mm.madvise(MADV_POPULATE_WRITE, self.start,
                            -(-self.size // mmap.PAGESIZE) * mmap.PAGESIZE)
        except (OSError, ValueError):
            return False
        return True

    def tensor(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int) -> torch.Tensor:
        """The next ``nbytes`` (64-byte aligned) as a tensor of its own (own storage and
        version counter) on this mapping."""
        off = self.start + self.used
        self.used = -(-(self.used + nbytes) // 64) * 64
        numel = nbytes // dtype.itemsize
        return torch.frombuffer(self.mm, dtype=dtype, count=numel, offset=off).view(shape)


class HugePageArena:
    """Bump allocator of CPU tensors on :class:`_Mapping` chunks of ``CHUNK_BYTES``: a
    model's many small weights (SmolLM2-135M: 182 tensors, most under 8 MiB) share huge
    pages instead of each sitting on 4 KiB heap pages. Nothing is freed before the arena
    and all its tensors are gone."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES):
        self.chunk_bytes = chunk_bytes
        self._chunk: _Mapping | None = None

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised (in fact zero) contiguous CPU tensor."""
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > self.chunk_bytes // 4:
            return _Mapping(nbytes).tensor(shape, dtype, nbytes)
        if self._chunk is None or self._chunk.used + nbytes > self._chunk.size:
            self._chunk = _Mapping(self.chunk_bytes)
        return self._chunk.tensor(shape, dtype, nbytes)


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu",
          arena: HugePageArena | None = None) -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, contiguous: from ``arena`` (on
    huge pages, faulted in when first written) for a non-empty CPU tensor with
    :func:`huge_pages_enabled`, else plain."""
    if (arena is None or torch.device(device).type != "cpu" or not huge_pages_enabled()
            or math.prod(shape) == 0):
        return torch.empty(shape, dtype=dtype, device=device)
    return arena.empty(shape, dtype)


def zeros(shape: tuple[int, ...], dtype: torch.dtype,
          device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)`` with every page resident when
    it returns: for the KV pool, whose pages a server's first requests would otherwise
    fault in one by one inside their prefill steps. On Linux (CPU, from
    ``MIN_MAPPING_BYTES`` up) a mapping of its own on 4 KiB pages, populated
    (``MADV_POPULATE_WRITE``; written with zeros on a kernel before 5.14), kept out of
    the heap and off huge pages: faulting a large pool in lazily put seconds of kernel
    time into a fresh server's first prefills, and populating it on huge pages was far
    slower at start than on 4 KiB pages for little decode gain
    (``benchmarks/decode/RESULTS.md``)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < MIN_MAPPING_BYTES or not _LINUX_MMAP:
        return torch.zeros(shape, dtype=dtype, device=device)
    m = _Mapping(nbytes, huge=False)
    t = m.tensor(shape, dtype, nbytes)
    return t if m.populate() else t.zero_()
