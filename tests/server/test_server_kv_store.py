"""Done when: two ``prefixcache serve`` replicas sharing one redis-server; a
prompt cold on replica A is a hit on replica B, and not for another tenant on B. The
shared tier going away degrades /health's ``kv_store``, never a request."""
from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import redis

from tests.helpers.wait import wait_until
from tests.server.live import KEYS, LiveServer, expected_hit, unique_prompt

KV_STORE_TIMEOUT_S = 3.0


@pytest.fixture(scope="module")
def pair(redis_server, tmp_path_factory):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    keys = tmp_path_factory.mktemp("kvs-keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    # a time budget a loaded machine does not reach by accident (a stalled Redis does)
    servers = [LiveServer(["--api-keys", str(keys), "--kv-store", redis_server.url,
                           "--kv-store-timeout-s", str(KV_STORE_TIMEOUT_S)],
                          tmp_path_factory.mktemp(f"kvs{i}") / "server.log") for i in range(2)]
    try:
        for s in servers:
            s.wait_ready()
        yield servers
    finally:
        for s in servers:
            s.stop()


def _usage(srv: LiveServer, prompt: str, key: str) -> dict:
    r = httpx.post(srv.v1 + "/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "builtin:tiny", "prompt": prompt, "max_tokens": 2,
                         "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def _wait_stored(srv: LiveServer, pages: int) -> None:
    def stored() -> bool:
        m = srv.metrics()
        return m.get("redis_tier_stores_total", 0) >= 1 and m.get("redis_tier_pages", 0) >= pages

    wait_until(stored, f"replica A to store {pages} pages")


def test_cold_on_a_then_cached_on_b_and_zero_for_another_tenant(pair):
    a, b = pair
    prompt = unique_prompt(40)
    cold = _usage(a, prompt, "sk-alice")
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    _wait_stored(a, cold["prompt_tokens"] // 16)
    warm = _usage(b, prompt, "sk-alice-2")  # same tenant, another key, another replica
    assert warm["prompt_tokens_details"]["cached_tokens"] == expected_hit(
        cold["prompt_tokens"]) > 0
    assert b.metrics()["redis_tier_hit_tokens_total"] == expected_hit(cold["prompt_tokens"])
    other = _usage(b, prompt, "sk-bob")
    assert other["prompt_tokens_details"]["cached_tokens"] == 0
    assert httpx.get(b.base + "/health", timeout=30).json() == {"status": "ok",
                                                                "kv_store": "ok"}


def test_a_stalled_redis_degrades_health_not_requests(pair, redis_server):
    a, _ = pair
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        usage = _usage(a, unique_prompt(30), "sk-bob")  # served; the tier times out
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        health = httpx.get(a.base + "/health", timeout=30)
        assert health.status_code == 200 and health.json()["kv_store"] == "degraded"
        assert a.metrics()["redis_tier_degraded"] == 1.0
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
