"""Paged decode attention read in place from the KV pool (CPU), from ``paged_decode.cpp``.

The kernel walks each decode row's page table and reads its keys and values where they
lie in the pool, with an online softmax per page: no gathered copy of the context (the
copy and the padded SDPA were half of a multi-sequence decode step,
``benchmarks/speed/analysis.md``). It is built with ``torch.utils.cpp_extension`` (gcc and
ninja, ``-O3 -march=native``) the first time a CPU decode step needs it, into
``$PREFIXCACHE_KERNEL_DIR`` (default ``~/.cache/prefixcache/kernels``), keyed by the
source, torch's version and the CPU's flags; later processes load the built library.

``PREFIXCACHE_DECODE_KERNEL=0`` turns it off (attention then gathers pages, as on CUDA).
When the build fails (no compiler), :func:`load` logs why once and returns ``None``, and
attention gathers.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode.cpp")
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-ffast-math"]
MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 256  # the kernel's fixed buffers

_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None


def enabled() -> bool:
    """Whether the kernel may be used (``PREFIXCACHE_DECODE_KERNEL`` is not ``0``)."""
    return os.environ.get("PREFIXCACHE_DECODE_KERNEL", "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_name() -> str:
    h = hashlib.sha256()
    for part in (SOURCE.read_bytes(), " ".join(CFLAGS).encode(), torch.__version__.encode(),
                 _cpu_flags().encode(), platform.machine().encode()):
        h.update(part)
        h.update(b"\0")
    return f"prefixcache_paged_decode_{h.hexdigest()[:16]}"


def _ensure_ninja() -> None:
    """Put the ``ninja`` wheel's binary on ``PATH`` when none is there (cpp_extension
    runs ``ninja`` by name)."""
    if shutil.which("ninja"):
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


def load() -> ModuleType | None:
    """The built kernel module, building it on first call; ``None`` when disabled or
    when the build failed (the reason is logged once and kept in :func:`failure`)."""
    global _module, _failed
    if _module is not None or _failed is not None or not enabled():
        return _module
    with _lock:
        if _module is not None or _failed is not None:
            return _module
        from torch.utils import cpp_extension

        name = _build_name()
        root = Path(os.environ.get("PREFIXCACHE_KERNEL_DIR",
                                   Path.home() / ".cache" / "prefixcache" / "kernels"))
        build = root / name
        log.info("loading the paged decode kernel from %s (built once: about 30 s)", build)
        try:
            build.mkdir(parents=True, exist_ok=True)
            _ensure_ninja()
            _module = cpp_extension.load(name=name, sources=[str(SOURCE)],
                                         extra_cflags=CFLAGS, build_directory=str(build),
                                         verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure falls back to gathering
            _failed = f"{type(e).__name__}: {e}"
            log.warning("paged decode kernel unavailable, attention gathers pages: %s",
                        _failed.splitlines()[0] if _failed else "")
        return _module


def failure() -> str | None:
    """Why the kernel could not be built, or ``None``."""
    return _failed


def supports(pool_k: torch.Tensor, num_heads: int) -> bool:
    """Whether the kernel handles a pool layer ``[P, block_size, kv_heads, head_dim]``
    with ``num_heads`` query heads (CPU, float32 or bfloat16, geometry within its
    buffers)."""
    _, bs, kvh, d = pool_k.shape
    return (pool_k.device.type == "cpu" and pool_k.dtype in (torch.float32, torch.bfloat16)
            and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP and d <= MAX_DIM
            and bs <= MAX_BLOCK)


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 page_table: torch.Tensor, ctx_lens: torch.Tensor, window: int | None,
                 scale: float) -> torch.Tensor:
    """Decode attention, ``[B, num_heads, head_dim]`` in ``q``'s dtype.

    Args:
        q: ``[B, num_heads, head_dim]`` queries (RoPE applied), one per row.
        k_pool, v_pool: one layer of the pool, ``[P, block_size, kv_heads, head_dim]``.
        page_table: int64 ``[B, max_pages]`` (rows may be padded past their context).
        ctx_lens: int64 ``[B]`` keys per row (the query's own included), ``>= 1``.
        window: sliding window in tokens (keys ``[ctx - window, ctx)``), or ``None``.
        scale: softmax scale (``head_dim ** -0.5``).

    Raises:
        RuntimeError: the kernel is unavailable (check :func:`load` first), or a page id
            lies outside the pool or a context beyond its page table.
    """
    mod = load()
    if mod is None:
        raise RuntimeError(f"paged decode kernel unavailable: {_failed or 'disabled'}")
    qf = q.to(torch.float32).contiguous()
    out = torch.empty_like(qf)
    mod.paged_decode(qf, k_pool, v_pool, page_table.contiguous(), ctx_lens.contiguous(),
                     out, -1 if window is None else int(window), float(scale))
    return out.to(q.dtype)
