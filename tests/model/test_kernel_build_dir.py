"""The kernels' build directory is shared safely between processes and checkouts: sources
are built from a copy inside it (same paths for every checkout), a cross-process ``flock``
serializes building, and a baton left by a process killed mid-build does not hang the next
one."""
from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from prefixcache.model.cpu.kernels import build, paged_prefill
from tests.helpers.kernels import built_or_skip
from tests.helpers.wait import wait_until


def test_sources_are_copied_once_and_a_stale_baton_is_removed(tmp_path: Path):
    (tmp_path / "lock").write_bytes(b"")  # cpp_extension's baton, its owner gone
    with build.build_lock(tmp_path):
        first = build.prepare_sources(tmp_path)
    assert not (tmp_path / "lock").exists()
    assert [p.name for p in first] == [s.name for s in build.SOURCES]
    for f in (*build.SOURCES, *build.HEADERS):
        assert (tmp_path / "src" / f.name).read_bytes() == f.read_bytes()
    mtimes = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "src").iterdir()}
    probe = tmp_path / "clock"  # a file written now has a later mtime: a rewrite would show

    def clock_moved() -> bool:
        probe.write_bytes(b"")
        return probe.stat().st_mtime_ns > max(mtimes.values())

    wait_until(clock_moved, "the file system clock to move past the copies")
    with build.build_lock(tmp_path):
        again = build.prepare_sources(tmp_path)
    assert again == first
    # unchanged bytes are not rewritten: ninja sees nothing new and rebuilds nothing
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "src").iterdir()} == mtimes
    # a copy that differs (an older checkout's) is replaced
    (tmp_path / "src" / "simd.h").write_bytes(b"// old\n")
    with build.build_lock(tmp_path):
        build.prepare_sources(tmp_path)
    assert (tmp_path / "src" / "simd.h").read_bytes() == build.HEADERS[0].read_bytes()
    assert sorted(p.name for p in (tmp_path / "src").iterdir()) == sorted(
        f.name for f in (*build.SOURCES, *build.HEADERS))  # no temporary files left


def _locked(path: Path) -> bool:
    with open(path / ".build.lock", "a+b") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_build_lock_excludes_other_processes_and_dies_with_its_holder(tmp_path: Path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from pathlib import Path\n"
         "from prefixcache.model.cpu.kernels import build\n"
         "with build.build_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True)\n"
         "    time.sleep(600)\n", str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[2])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert _locked(tmp_path)
        holder.send_signal(signal.SIGKILL)  # killed while holding it, as mid-build
        holder.wait(timeout=30)
        assert not _locked(tmp_path)
        with build.build_lock(tmp_path):
            assert _locked(tmp_path)  # another open file description sees it held
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.fixture(scope="module")
def built():
    return built_or_skip(paged_prefill, "paged prefill")


def test_the_loaded_library_is_built_from_the_copy(built):
    d = build.build_dir()
    ninja = (d / "build.ninja").read_text()
    for f in build.SOURCES:
        assert str(d / "src" / f.name) in ninja
        assert str(f) not in ninja  # never this checkout's own path
    assert not (d / "lock").exists()


def test_each_python_environment_builds_in_a_directory_of_its_own(monkeypatch):
    """Two virtual environments' build commands name different torch headers: sharing a
    directory, each one's load would rewrite build.ninja and rebuild the library."""
    here = build.build_name()
    assert build.build_name() == here  # the same environment: the same directory
    assert str(Path(torch.__file__).resolve().parent) in build.environment()
    monkeypatch.setattr(build, "environment", lambda: ["/other/venv/torch", "/other/include",
                                                       "3.11.7"])
    other = build.build_name()
    assert other != here and other.startswith("prefixcache_cpu_kernels_")


def test_every_process_builds_with_the_wheels_ninja_whatever_path_holds(tmp_path, monkeypatch):
    """A system ninja first on PATH (another version, which hashes command lines
    differently) must not be used: alternating ninjas rebuild the library on each load."""
    import ninja  # a runtime dependency (pyproject)
    system = tmp_path / "bin"
    system.mkdir()
    (system / "ninja").write_text("#!/bin/sh\nexit 1\n")
    (system / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", f"{system}{os.pathsep}/usr/bin")
    build._ensure_ninja()
    assert os.environ["PATH"].split(os.pathsep)[:2] == [str(ninja.BIN_DIR), str(system)]
    build._ensure_ninja()  # idempotent: not prepended twice
    assert os.environ["PATH"].split(os.pathsep)[:2] == [str(ninja.BIN_DIR), str(system)]
    assert str(ninja.BIN_DIR) in build.environment()
