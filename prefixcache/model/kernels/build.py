"""Build and load the CPU kernels (``*.cpp`` here) with ``torch.utils.cpp_extension``.

Built with gcc and ninja (``-O3 -march=native -ffast-math``) the first time a CPU model
needs them, into ``$PREFIXCACHE_KERNEL_DIR`` (default ``~/.cache/prefixcache/kernels``),
keyed by the sources, the flags, torch's version and the CPU's flags; later processes load
the built library (about 30 s to build on the project's 2-core machine, once).

The library holds the paged decode and prefill attention kernels, the fused elementwise
ops of the decoder layer (``fused_ops.cpp``: compiled without fast-math by a pragma, since
they must return torch's bits) and the linear kernel of 1-8 rows (``small_gemm.cpp``).
``PREFIXCACHE_CPU_KERNELS=0`` turns them all off (the model then runs torch ops only, as
on CUDA). When the build fails (no compiler), :func:`load` logs why once and returns ``None``, and
the model runs torch ops.
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

HERE = Path(__file__).parent
SOURCES = [HERE / "bindings.cpp", HERE / "paged_decode.cpp", HERE / "paged_prefill.cpp",
           HERE / "fused_ops.cpp", HERE / "small_gemm.cpp"]
HEADERS = [HERE / "simd.h"]
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-ffast-math"]

_lock = threading.Lock()
_module: ModuleType | None = None
_failed: str | None = None


def enabled() -> bool:
    """Whether the kernels may be used (``PREFIXCACHE_CPU_KERNELS`` is not ``0``)."""
    return os.environ.get("PREFIXCACHE_CPU_KERNELS", "1") != "0"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def build_name() -> str:
    """The library's name: ``prefixcache_cpu_kernels_`` and a digest of what it is built
    from (sources, flags, torch version, CPU flags, machine)."""
    h = hashlib.sha256()
    parts = [p.read_bytes() for p in [*SOURCES, *HEADERS]] + [
        " ".join(CFLAGS).encode(), torch.__version__.encode(), _cpu_flags().encode(),
        platform.machine().encode()]
    for part in parts:
        h.update(part)
        h.update(b"\0")
    return f"prefixcache_cpu_kernels_{h.hexdigest()[:16]}"


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
    """The kernels' module, built on first call; ``None`` when disabled or when the build
    failed (the reason is logged once and kept in :func:`failure`)."""
    global _module, _failed
    if _module is not None or _failed is not None or not enabled():
        return _module
    with _lock:
        if _module is not None or _failed is not None:
            return _module
        from torch.utils import cpp_extension

        name = build_name()
        root = Path(os.environ.get("PREFIXCACHE_KERNEL_DIR",
                                   Path.home() / ".cache" / "prefixcache" / "kernels"))
        build = root / name
        log.info("loading the CPU kernels from %s (built once: about 30 s)", build)
        try:
            build.mkdir(parents=True, exist_ok=True)
            _ensure_ninja()
            _module = cpp_extension.load(name=name, sources=[str(s) for s in SOURCES],
                                         extra_cflags=CFLAGS, build_directory=str(build),
                                         verbose=False)
        except Exception as e:  # noqa: BLE001 - any build failure falls back to torch ops
            _failed = f"{type(e).__name__}: {e}"
            log.warning("CPU kernels unavailable, the model runs torch ops: %s",
                        _failed.splitlines()[0])
        return _module


def failure() -> str | None:
    """Why the kernels could not be built, or ``None``."""
    return _failed


