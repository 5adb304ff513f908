"""Persistence in a real redis-server: round trip, restart, corrupt entries, Redis down."""
from __future__ import annotations

import time

import redis

from prefixcache.gateway.semantic.cache import SemanticCache
from prefixcache.gateway.semantic.index import Entry
from prefixcache.gateway.semantic.redis_store import RedisEntryStore, decode_entry, encode_entry
from tests.gateway.semantic.conftest import BUDGET_S

A, B = b"\x01scope-a", b"\x02scope-b"


def keys(url: str) -> list[bytes]:
    return sorted(redis.Redis.from_url(url).keys("prefixcache:semantic:*"))


def test_round_trip_and_restart(toy, redis_url):
    first = SemanticCache(toy, threshold=0.8, redis_url=redis_url)
    first.store(A, "how do i reset my password", b"answer-A")
    first.store(B, "how do i reset my password", b"answer-B")
    first.store(A, "what is the capital of france", b"\x00\xffParis")
    first.close()                                   # flushes the write queue
    assert len(keys(redis_url)) == 3
    ttl = redis.Redis.from_url(redis_url).pttl(keys(redis_url)[0])
    assert 0 < ttl <= 3600 * 1000

    second = SemanticCache(toy, threshold=0.8, redis_url=redis_url)   # a restart
    assert len(second.index) == 3 and second.store_backend is not None
    assert second.store_backend.corrupt == 0
    hit_a = second.lookup(A, "how do i reset my password please")
    hit_b = second.lookup(B, "how do i reset my password please")
    assert hit_a is not None and hit_b is not None
    assert (hit_a.value, hit_b.value) == (b"answer-A", b"answer-B")
    hit = second.lookup(A, "what is the capital of france")
    assert hit is not None and hit.value == b"\x00\xffParis"
    assert second.lookup(b"other", "how do i reset my password") is None
    second.close()


def test_corrupt_entries_are_missed_and_removed(toy, redis_url):
    cache = SemanticCache(toy, redis_url=redis_url)
    for text in ("alpha question", "beta question", "gamma question", "delta question"):
        cache.store(A, text, text.encode())
    cache.close()
    r = redis.Redis.from_url(redis_url)
    store = RedisEntryStore(redis_url, toy.dim, timeout_s=BUDGET_S)
    k_alpha, k_beta, k_gamma = (store.key(A, t) for t in
                                ("alpha question", "beta question", "gamma question"))
    r.hset(k_alpha, "value", b"tampered")           # checksum no longer matches
    r.hset(k_beta, "vec", b"\x00" * 7)              # wrong length
    r.hdel(k_gamma, "sum")                          # missing field
    r.hset(b"prefixcache:semantic:zz:junk", "vec", b"1")  # key that is not ours to parse
    store.close()

    restarted = SemanticCache(toy, threshold=0.8, redis_url=redis_url)
    assert restarted.store_backend is not None and restarted.store_backend.corrupt == 4
    assert len(restarted.index) == 1
    assert restarted.lookup(A, "alpha question") is None
    hit = restarted.lookup(A, "delta question")
    assert hit is not None and hit.value == b"delta question"
    assert keys(redis_url) == [store.key(A, "delta question")]   # the bad ones are gone
    restarted.close()


def test_entry_codec_rejects_any_single_byte_flip(toy):
    vec = toy.embed(["some text"])[0]
    fields = encode_entry(Entry("some text", vec, b"value", 123.5))
    good = decode_entry(fields, toy.dim)
    assert good is not None and (good.text, good.value, good.created) == ("some text", b"value",
                                                                          123.5)
    for name, blob in fields.items():
        for pos in range(0, len(blob), max(1, len(blob) // 16)):
            bad = dict(fields)
            bad[name] = blob[:pos] + bytes([blob[pos] ^ 0x01]) + blob[pos + 1:]
            assert decode_entry(bad, toy.dim) is None, (name, pos)


def test_redis_down_degrades_to_memory(toy):
    cache = SemanticCache(toy, threshold=0.8, redis_url="redis://127.0.0.1:1/0")
    assert len(cache.index) == 0
    assert cache.store_backend is not None and cache.store_backend.errors == 1
    cache.store(A, "how do i reset my password", b"x")   # queued; the writer counts the error
    assert cache.lookup(A, "how do i reset my password") is not None
    backend = cache.store_backend
    cache.close()
    assert backend.errors == 2 and backend.stored == 0


def test_full_write_queue_drops_and_counts(toy, redis_url):
    store = RedisEntryStore(redis_url, toy.dim, queue_size=1, timeout_s=BUDGET_S)
    vec = toy.embed(["x"])[0]
    for i in range(50):
        store.put(A, Entry(f"q{i}", vec, b"v", time.time()))
    store.close()
    assert store.stored + store.dropped == 50 and store.dropped >= 1
    assert len(keys(redis_url)) == store.stored
