"""Shared test helpers.

``shared_data(name)`` returns the path of a folder (or file) of the shared benchmark data
(``<repo>/../shared/data``, or ``$PREFIXCACHE_DATA``). When it is missing the test is
skipped with a message naming it, except under CI (``CI=true``), where it fails.
The implementation lives in ``tests/helpers/data.py``: import it from there
(``from helpers.data import shared_data``) or use the ``shared_data_path`` fixture;
``from conftest import shared_data`` breaks as soon as another test folder has its own
``conftest.py``.
"""
from __future__ import annotations

import os

import pytest

# The CPU kernels run in every test on every CPU: compute backend ``auto`` (the default)
# reads this once per model load and picks ``cpu-kernels`` (without it, only where AVX-512F
# is; tests/model/test_kernel_isa_gate.py checks that choice), so the suite checks the same
# code paths on an AVX2 machine as on an AVX-512 one.
os.environ.setdefault("PREFIXCACHE_CPU_KERNELS", "1")

from helpers.data import data_root, shared_data  # noqa: E402, F401  (re-exported)


@pytest.fixture(scope="session")
def shared_data_path():
    """Fixture form of :func:`shared_data`: call it with a folder name."""
    return shared_data


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A real ``redis-server`` on 127.0.0.1 (see ``tests/helpers/redis_server.py``);
    tests flush it with ``FLUSHALL`` where they need it empty."""
    from helpers.redis_server import RedisServer

    srv = RedisServer(tmp_path_factory.mktemp("redis"))
    yield srv
    srv.stop()
