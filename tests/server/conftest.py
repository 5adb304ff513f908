"""Session fixtures: the live servers of :mod:`tests.server.live`."""
from __future__ import annotations

import json

import pytest

from tests.server.live import KEYS, LiveServer


def _start(tmp_path_factory, name: str, args: list[str]) -> LiveServer:
    srv = LiveServer(args, tmp_path_factory.mktemp(name) / "server.log")
    try:
        srv.wait_ready()
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = _start(tmp_path_factory, "server", ["--served-model-name", "tiny", "builtin:tiny",
                                               "--allow-reset"])
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def tenant_server(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    srv = _start(tmp_path_factory, "tenants", ["--served-model-name", "tiny",
                                               "--api-keys", str(keys),
                                               "--max-num-seqs", "2",
                                               "--max-waiting-requests", "2"])
    yield srv
    srv.stop()
