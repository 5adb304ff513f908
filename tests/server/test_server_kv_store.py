"""Done when (issue 15): two ``prefixcache serve`` replicas sharing one redis-server; a
prompt cold on replica A is a hit on replica B, and not for another tenant on B. The
shared tier going away degrades /health's ``kv_store``, never a request."""
from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
import redis

from tests.server.live import KEYS, LiveServer, expected_hit, unique_prompt


@pytest.fixture(scope="module")
def pair(redis_server, tmp_path_factory):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    keys = tmp_path_factory.mktemp("kvs-keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    servers = [LiveServer(["--api-keys", str(keys), "--kv-store", redis_server.url,
                           "--kv-store-timeout-s", "0.2"],
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
    import time
    t0 = time.monotonic()
    while srv.metrics().get("redis_tier_stores_total", 0) < 1 or srv.metrics().get(
            "redis_tier_pages", 0) < pages:
        assert time.monotonic() - t0 < 20, "replica A never stored its pages"
        time.sleep(0.05)


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
    assert httpx.get(b.base + "/health", timeout=5).json() == {"status": "ok",
                                                               "kv_store": "ok"}


def test_a_stalled_redis_degrades_health_not_requests(pair, redis_server):
    a, _ = pair
    os.kill(redis_server.proc.pid, signal.SIGSTOP)
    try:
        usage = _usage(a, unique_prompt(30), "sk-bob")  # served; the tier times out
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        health = httpx.get(a.base + "/health", timeout=5)
        assert health.status_code == 200 and health.json()["kv_store"] == "degraded"
        assert a.metrics()["redis_tier_degraded"] == 1.0
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
