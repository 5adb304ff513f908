"""Session fixtures: the live servers of :mod:`tests.server.live`."""
from __future__ import annotations

import json

import pytest

from tests.server.live import HEADER_TIMEOUT_S, KEYS, LiveServer


def _start(tmp_path_factory, name: str, args: list[str]) -> LiveServer:
    return LiveServer(args, tmp_path_factory.mktemp(name) / "server.log")


@pytest.fixture(scope="session")
def _live_servers(tmp_path_factory):
    """Both servers, started together (their start-up is mostly imports: in parallel
    it takes about half the time)."""
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    servers = {
        "server": _start(tmp_path_factory, "server", [
            "--served-model-name", "tiny", "builtin:tiny", "--allow-reset",
            "--header-timeout-s", str(HEADER_TIMEOUT_S)]),
        "tenant_server": _start(tmp_path_factory, "tenants", [
            "--served-model-name", "tiny", "--api-keys", str(keys),
            "--max-num-seqs", "2", "--max-waiting-requests", "2"]),
    }
    try:
        for srv in servers.values():
            srv.wait_ready()
        yield servers
    finally:
        for srv in servers.values():
            srv.stop()


@pytest.fixture(scope="session")
def server(_live_servers) -> LiveServer:
    """Single tenant (no key file), ``--allow-reset``, served as ``tiny`` and
    ``builtin:tiny``, ``--header-timeout-s`` :data:`~tests.server.live.HEADER_TIMEOUT_S`."""
    return _live_servers["server"]


@pytest.fixture(scope="session")
def tenant_server(_live_servers) -> LiveServer:
    """``--api-keys`` (:data:`~tests.server.live.KEYS`: tenants alice, bob, ops=admin)
    and a small queue: ``--max-num-seqs 2 --max-waiting-requests 2``."""
    return _live_servers["tenant_server"]
