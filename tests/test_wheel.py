"""Nothing assumes a source checkout: the wheel, installed outside the repository, runs
``prefixcache demo`` and ``prefixcache analyze`` from a folder outside it.

The wheel is built from a copy of the project files (so the build writes nothing into the
worktree) and installed with ``pip install --no-deps --target DIR``; its dependencies come
from this interpreter's site-packages. ``PYTHONPATH=DIR`` puts the installed copy ahead of
the editable one, and each run checks that ``prefixcache.__file__`` lies inside ``DIR``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the install folder, a run folder outside the repository, the environment)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "prefixcache", src / "prefixcache",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFIXCACHE_DATA", "PYTHONPATH", "PREFIXCACHE_HASH_SEED")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1", OMP_WAIT_POLICY="PASSIVE")
    wheels = tmp / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "--wheel-dir", str(wheels), str(src)], tmp, env)
    (wheel,) = wheels.glob("prefixcache-*.whl")
    target = tmp / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target),
          str(wheel)], tmp, env)
    shutil.rmtree(src)  # the installed copy must not lean on the sources
    run_dir = tmp / "elsewhere"
    run_dir.mkdir()
    env["PYTHONPATH"] = str(target)
    return target, run_dir, env


def _prefixcache(target: Path) -> list[str]:
    script = target / "bin" / "prefixcache"
    assert script.is_file(), "the wheel installs no prefixcache console script"
    return [sys.executable, str(script)]


def test_the_installed_copy_is_the_one_imported(installed):
    target, run_dir, env = installed
    out = _run([sys.executable, "-c", "import prefixcache, prefixcache.analyze.pricing as p; "
                "print(prefixcache.__file__); print(p.__file__)"], run_dir, env).stdout.split()
    assert all(Path(f).is_relative_to(target) for f in out), out
    assert (target / "prefixcache" / "analyze" / "prices" / "openai.json").is_file()


def test_demo_runs_from_outside_the_repository(installed):
    target, run_dir, env = installed
    proc = _run([*_prefixcache(target), "demo", "--model", "builtin:tiny",
                 "--prefix-repeat", "1", "--burst", "2", "--num-pages", "256"], run_dir, env)
    out = " ".join(proc.stdout.split())
    assert "warm 5" in out and "hit rate" in out
    assert "burst of 2 identical cold requests" in out
    assert sorted(p.name for p in run_dir.iterdir()) == []  # wrote nothing into the cwd


def test_analyze_runs_from_outside_the_repository(installed):
    target, run_dir, env = installed
    log = run_dir.parent / "log.jsonl"
    prompt = list(range(1, 41))
    log.write_text("\n".join(json.dumps(r) for r in [
        {"request_id": "a", "prompt": prompt, "timestamp": 0},
        {"request_id": "b", "prompt": prompt + list(range(41, 61)), "timestamp": 1}]) + "\n")
    report = run_dir.parent / "report.json"
    _run([*_prefixcache(target), "analyze", str(log), "--block-size", "16", "--prices",
          "openai", "--json", str(report), "--quiet"], run_dir, env)
    r = json.loads(report.read_text())
    assert (r["requests"], r["prompt_tokens"], r["cached_tokens"]) == (2, 100, 32)
    assert [c["cached_tokens"] for c in r["calls"]] == [0, 32]
    assert r["costs"] and all(c["label"].startswith("openai/") for c in r["costs"])
