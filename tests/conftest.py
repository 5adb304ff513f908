"""Shared test helpers.

``shared_data(name)`` returns the path of a folder (or file) of the shared benchmark data
(``<repo>/../shared/data``, or ``$PREFIXCACHE_DATA``). When it is missing the test is
skipped with a message naming it, except under CI (``CI=true``), where it fails.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    env = os.environ.get("PREFIXCACHE_DATA")
    return Path(env) if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def shared_data(name: str) -> Path:
    path = data_root() / name
    if not path.exists():
        msg = f"shared data folder missing: {path} (set PREFIXCACHE_DATA)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture
def shared_data_path():
    """Fixture form of :func:`shared_data` (call it with a folder name), for test modules
    that cannot import this conftest by name."""
    return shared_data
