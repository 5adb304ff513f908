"""Layer 1 storage (in-process LRU, a real Redis shared by two gateway replicas) and the
layer-2 hook (a stub semantic cache: opt-in, scoped, tenant-safe)."""
from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from dataclasses import dataclass

import pytest
import redis

from prefixcache.gateway.policy import TenantPolicy
from prefixcache.gateway.store import MemoryStore, RedisStore, open_store
from tests.gateway.conftest import A, B, chat, make_gateway, run
from tests.helpers.wait import wait_until
from tests.server.live import free_port

M = "gpt-4.1"
BUDGET_S = 10.0  # a Redis call's time budget no loaded machine reaches by accident


def test_the_lru_evicts_the_least_recently_used_and_expires_by_ttl():
    now = [0.0]
    s = MemoryStore(2, clock=lambda: now[0])

    async def go():
        await s.set(b"a", b"1", 10)
        await s.set(b"b", b"2", 10)
        assert await s.get(b"a") == b"1"     # a is now the most recent
        await s.set(b"c", b"3", 10)          # evicts b
        assert (await s.get(b"b"), await s.get(b"a"), await s.get(b"c")) == (None, b"1", b"3")
        now[0] = 10.0
        assert await s.get(b"a") is None and len(s) == 1

    asyncio.run(go())
    with pytest.raises(ValueError, match="max_entries"):
        MemoryStore(0)
    with pytest.raises(ValueError, match="--cache-store"):
        open_store("memcached://x")


@pytest.fixture
def redis_url():
    exe = shutil.which("redis-server")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is not installed")
        pytest.skip("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([exe, "--port", str(port), "--save", "", "--appendonly", "no",
                             "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        wait_until(redis.Redis.from_url(url).ping, "redis-server to answer PING",
                   ignore=(redis.ConnectionError,))
    except AssertionError:
        proc.kill()
        raise
    yield url
    proc.terminate()
    proc.wait(10)


def test_two_replicas_share_redis_and_tenants_stay_apart(emulators, redis_url):
    emu, url = emulators("openai")
    up = [("oa", url, "openai", (M,))]

    async def ask(c, h):
        r = await c.post("/v1/chat/completions", json=chat(M, "shared?"), headers=h)
        return r.headers["x-prefixcache-cache"], r.json()["choices"][0]["message"]["content"]

    first = run(lambda c: ask(c, A), make_gateway(up, store=RedisStore(redis_url, BUDGET_S)))
    second = run(lambda c: ask(c, A), make_gateway(up, store=RedisStore(redis_url, BUDGET_S)))
    other = run(lambda c: ask(c, B), make_gateway(up, store=RedisStore(redis_url, BUDGET_S)))
    assert first[0] == "miss" and second == ("exact", first[1]) and other[0] == "miss"
    assert emu.calls == 2
    keys = redis.Redis.from_url(redis_url).keys("prefixcache:gw:*")
    assert len(keys) == 2
    ttl = redis.Redis.from_url(redis_url).ttl(keys[0])
    assert 3500 < ttl <= 3600


def test_a_redis_that_is_down_degrades_to_misses(emulators):
    emu, url = emulators("openai")
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)

    async def go(c):
        return [(await c.post("/v1/chat/completions", json=chat(M, "down"), headers=A)
                 ).status_code for _ in range(2)]

    assert run(go, make_gateway([("oa", url, "openai", (M,))], store=store)) == [200, 200]
    assert emu.calls == 2 and store.errors == 4


@dataclass
class _Hit:
    value: bytes
    score: float


class StubSemantic:
    """Matches texts equal up to case, within one scope (the interface of
    prefixcache.gateway.semantic.cache.SemanticCache)."""

    def __init__(self):
        self.entries: dict[tuple[bytes, str], bytes] = {}
        self.lookups: list[tuple[bytes, str]] = []

    def lookup(self, scope: bytes, text: str):
        self.lookups.append((scope, text))
        v = self.entries.get((scope, text.lower()))
        return None if v is None else _Hit(v, 0.99)

    def store(self, scope: bytes, text: str, value: bytes) -> None:
        self.entries[(scope, text.lower())] = value


def test_the_semantic_layer_is_opt_in_scoped_and_tenant_safe(emulators):
    emu, url = emulators("openai")
    sem = StubSemantic()
    gw = make_gateway([("oa", url, "openai", (M,))], semantic=sem,
                      policies={"alice": TenantPolicy(semantic=True),
                                "bob": TenantPolicy(semantic=True)})

    async def go(c):
        out = []
        tool = [{"type": "function", "function": {"name": "refund", "parameters": {}}}]
        for h, q, s, kw in ((A, "Refund window?", "S", {}), (A, "refund WINDOW?", "S", {}),
                            (A, "refund window?", "other system", {}),
                            (A, "refund window?", "S", {"tools": tool}),
                            (B, "refund window?", "S", {})):
            r = await c.post("/v1/chat/completions", json=chat(M, q, system=s, **kw),
                             headers=h)
            out.append(r.headers["x-prefixcache-cache"])
        return out

    assert run(go, gw) == ["miss", "semantic", "miss", "miss", "miss"]
    assert emu.calls == 4
    assert len({scope for scope, _ in sem.lookups}) == 4  # S, other system, tools, bob
    off = make_gateway([("oa", url, "openai", (M,))], semantic=StubSemantic())
    run(lambda c: c.post("/v1/chat/completions", json=chat(M, "q"), headers=A), off)
    assert off.semantic.lookups == []


class CountingStore(MemoryStore):
    def __init__(self):
        super().__init__()
        self.deleted: list[bytes] = []

    async def delete(self, key: bytes) -> None:
        self.deleted.append(key)
        await super().delete(key)


def test_a_corrupt_layer1_entry_is_a_miss_and_is_removed(emulators):
    emu, url = emulators("openai")
    store = CountingStore()
    gw = make_gateway([("oa", url, "openai", (M,))], store=store)

    async def go(c):
        first = await c.post("/v1/chat/completions", json=chat(M, "flip"), headers=A)
        (key, (exp, value)), = store._data.items()
        store._data[key] = (exp, value[:20] + bytes([value[20] ^ 1]) + value[21:])
        second = await c.post("/v1/chat/completions", json=chat(M, "flip"), headers=A)
        third = await c.post("/v1/chat/completions", json=chat(M, "flip"), headers=A)
        return key, [r.headers["x-prefixcache-cache"] for r in (first, second, third)]

    key, layers = run(go, gw)
    assert layers == ["miss", "miss", "exact"]  # the corrupt value is never served
    assert store.deleted == [key] and emu.calls == 2
