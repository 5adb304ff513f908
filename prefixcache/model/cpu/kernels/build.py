"""Build and load the CPU kernels (``*.cpp`` here) with ``torch.utils.cpp_extension``.

Built with gcc and ninja (``-O3 -march=native -ffast-math``) the first time a CPU model
needs them, into ``$PREFIXCACHE_KERNEL_DIR`` (default ``~/.cache/prefixcache/kernels``),
keyed by the sources, the flags, torch's version and place, Python and the CPU's flags;
later processes load the built library (about 30 s to build on the project's 2-core machine,
once).

Processes share a build directory safely: the sources are copied into its ``src/``
(rewritten only when their bytes differ), so every checkout or install of the same code in
one Python environment builds from the same paths and finds the library already built,
instead of rebuilding it under the other's feet (another environment gets a directory of its
own); and building or loading holds an exclusive ``flock`` on the directory's
``.build.lock``, which the kernel releases when its holder exits or is killed. Under that
lock, the baton file ``cpp_extension`` leaves behind when a process dies mid-build
(``lock``, on which every later process would otherwise wait forever) is stale by
construction and is removed.

The library holds the paged decode and prefill attention kernels, the fused elementwise ops
of the decoder layer (``fused_ops.cpp``: compiled without fast-math by a pragma, since they
must return torch's bits) and the linear kernel of 1-8 rows (``small_gemm.cpp``).
The compute backend chooses at load whether they run (``EngineConfig.compute_backend``:
``cpu-kernels`` on any CPU; ``auto`` only where the CPU has AVX-512F, :func:`isa_supported`):
their tiles are sized for 32 zmm registers, and with 16 ymm registers (AVX2 only) they
are slower than torch ops: GCC splits the 64-byte vectors through xmm moves and stack
spills, and the small GEMM falls back to a scalar loop (figures in
``benchmarks/decode/RESULTS.md``). When the
build fails (no compiler), :func:`load` logs why once and returns ``None``, and the model
runs torch ops.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
import sys
import sysconfig
import threading
from collections.abc import Iterator
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


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def isa_supported(flags: str | None = None) -> bool:
    """Whether the CPU (or the ``/proc/cpuinfo`` ``flags`` line given) has AVX-512F, the
    instruction set the kernels are tuned for."""
    line = _cpu_flags() if flags is None else flags
    return "avx512f" in line.replace(":", " ").split()


def environment() -> list[str]:
    """What the build's command lines name besides the sources: torch's and Python's
    header directories (a virtual environment of its own each). Two environments sharing
    one build directory would rewrite each other's ``build.ninja``, and ninja would rebuild
    the whole library (minutes) every time a process of the other one loads it."""
    return [str(Path(torch.__file__).resolve().parent), sysconfig.get_paths()["include"],
            sys.version]


def build_name() -> str:
    """The library's name: ``prefixcache_cpu_kernels_`` and a digest of what it is built
    from (sources, flags, torch version, CPU flags, machine, :func:`environment`)."""
    h = hashlib.sha256()
    parts = [p.read_bytes() for p in [*SOURCES, *HEADERS]] + [
        " ".join(CFLAGS).encode(), torch.__version__.encode(), _cpu_flags().encode(),
        platform.machine().encode(), *(e.encode() for e in environment())]
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


def build_dir() -> Path:
    """Where this code's library is built: ``$PREFIXCACHE_KERNEL_DIR`` (default
    ``~/.cache/prefixcache/kernels``) / :func:`build_name`."""
    root = Path(os.environ.get("PREFIXCACHE_KERNEL_DIR",
                               Path.home() / ".cache" / "prefixcache" / "kernels"))
    return root / build_name()


@contextlib.contextmanager
def build_lock(build: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``build/.build.lock`` (created if absent) for the
    block; blocks while another process holds it. Released when the block ends or the
    process dies. Where ``fcntl`` is missing (not POSIX) the block runs unlocked."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - POSIX only
        yield
        return
    with open(build / ".build.lock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def prepare_sources(build: Path) -> list[Path]:
    """Copy :data:`SOURCES` and :data:`HEADERS` into ``build/src`` (a file is rewritten only
    when its bytes differ, so an unchanged copy keeps its mtime and ninja rebuilds nothing)
    and remove ``cpp_extension``'s stale baton ``build/lock``; returns the copied sources'
    paths, in :data:`SOURCES` order. Call it under :func:`build_lock`."""
    src = build / "src"
    src.mkdir(parents=True, exist_ok=True)
    for f in (*SOURCES, *HEADERS):
        data = f.read_bytes()
        dst = src / f.name
        if not dst.is_file() or dst.read_bytes() != data:
            tmp = dst.with_name(f".{dst.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, dst)
    baton = build / "lock"
    if baton.exists():
        log.warning("removing %s, left by a process that died while building the kernels",
                    baton)
        baton.unlink(missing_ok=True)
    return [src / f.name for f in SOURCES]


def load() -> ModuleType | None:
    """The kernels' module, built on first call; ``None`` when the build failed (the
    reason is logged once and kept in :func:`failure`)."""
    global _module, _failed
    if _module is not None or _failed is not None:
        return _module
    with _lock:
        if _module is not None or _failed is not None:
            return _module
        from torch.utils import cpp_extension

        build = build_dir()
        name = build.name
        log.info("loading the CPU kernels from %s (built once: about 30 s)", build)
        try:
            build.mkdir(parents=True, exist_ok=True)
            _ensure_ninja()
            with build_lock(build):
                sources = prepare_sources(build)
                _module = cpp_extension.load(name=name, sources=[str(s) for s in sources],
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


