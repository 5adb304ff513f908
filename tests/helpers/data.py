"""Where the shared benchmark/test data lives: :func:`prefixcache.paths.data_root`
(``$PREFIXCACHE_DATA``, or ``<repo>/../shared/data``).

``shared_data(name)`` returns the path of a folder (or file) there. When it is missing the
calling test is skipped with a message naming the missing path, except under CI
(``CI=true``), where it fails. Import it as ``from helpers.data import shared_data`` (a
uniquely named module: several test folders have their own ``conftest.py``, so
``from conftest import ...`` may find the wrong one), or use the ``shared_data_path``
fixture of ``tests/conftest.py``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefixcache.paths import data_root


def shared_data(name: str) -> Path:
    path = data_root() / name
    if not path.exists():
        msg = f"shared data folder missing: {path} (set PREFIXCACHE_DATA)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path
