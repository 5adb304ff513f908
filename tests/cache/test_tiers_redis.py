"""The shared KV tier on a real redis-server: keys, values in the tiers' format, SET NX +
TTL, lookups that stop at the first miss and never extend a TTL, corrupt values (the pages
before the first one load, every one read is deleted), writes Redis refuses (counted per page),
the compute lock, and Redis down or slow."""
from __future__ import annotations

import os
import signal

import pytest
import redis

from helpers.redis_server import RedisServer
from prefixcache.cache.tiers.base import Tier
from prefixcache.cache.tiers.format import PageGroup
from prefixcache.cache.tiers.redis_store import KEY_VERSION, RedisTier
from tests.helpers.wait import wait_until

FP = b"\x01" * 16
BS = 4
BUDGET_S = 10.0  # a call's time budget no loaded machine reaches (a stalled Redis does)
SHAPE = (2, 1, BS, 1, 2)  # one page's payload: 16 float32


def _group(hashes: list[bytes], fill: int = 0) -> PageGroup:
    n = len(hashes)
    payload = bytes((fill + i) % 251 for i in range(n * 64))
    toks = tuple(tuple(range(i * BS, (i + 1) * BS)) for i in range(n))
    return PageGroup(FP, tuple(hashes), toks, "float32", SHAPE, payload)


@pytest.fixture()
def tier(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    t = RedisTier(redis_server.url, FP, timeout_s=BUDGET_S)
    yield t
    t.close()
    client.close()


def _h(i: int) -> bytes:
    return i.to_bytes(16, "big")


def test_round_trip_keys_and_first_miss(tier):
    assert isinstance(tier, Tier)
    hashes = [_h(i) for i in range(5)]
    assert tier.put(_group(hashes[:3]))
    raw = tier.client.get(KEY_VERSION + b":" + FP + b":" + hashes[1])
    assert raw is not None and raw[:4] == b"PCKV"  # one whole value per key
    assert tier.lookup_run(hashes) == 3
    assert tier.lookup_run(hashes[3:]) == 0
    assert tier.lookup_run([hashes[0], hashes[4], hashes[1]]) == 1
    got = tier.get(hashes[1:3])
    assert got is not None and got.hashes == tuple(hashes[1:3])
    assert got.payload == _group(hashes[:3]).payload[64:]
    assert got.token_ids == ((4, 5, 6, 7), (8, 9, 10, 11))
    part = tier.get(hashes[2:4])  # the pages up to the missing one
    assert part is not None and part.hashes == (hashes[2],)
    assert part.payload == _group(hashes[:3]).payload[128:]
    assert tier.get(hashes[3:5]) is None  # the first page missing: a miss
    assert tier.contains(hashes[0]) and not tier.contains(hashes[4])
    s = tier.stats()
    assert (s.stores, s.pages, s.loads, s.hits, s.misses) == (1, 3, 2, 3, 2)


def test_set_nx_with_ttl_and_lookups_never_extend_it(tier):
    h = _h(7)
    assert tier.put(_group([h], fill=1))
    assert tier.put(_group([h], fill=2))  # already there: left alone
    assert tier.stats().skipped == 1
    assert tier.get([h]).payload == _group([h], fill=1).payload
    key = tier.key(h)
    ttl = tier.client.pttl(key)
    assert 0 < ttl <= 3600 * 1000
    wait_until(lambda: tier.client.pttl(key) < ttl, "the TTL to count down")
    left = tier.client.pttl(key)
    tier.lookup_run([h])
    tier.get([h])
    assert tier.client.pttl(key) <= left  # only SET sets a TTL


def test_corrupt_and_foreign_values_are_misses_deleted_and_counted(tier):
    a, b = _h(1), _h(2)
    tier.put(_group([a, b]))
    raw = bytearray(tier.client.get(tier.key(a)))
    raw[-1] ^= 0xFF  # payload bit flip: the checksum fails
    tier.client.set(tier.key(a), bytes(raw))
    assert tier.get([a, b]) is None
    assert tier.client.exists(tier.key(a)) == 0 and tier.stats().corrupt == 1
    tier.client.set(tier.key(b), tier.client.get(tier.key(b))[:-3])  # truncated
    assert tier.get([b]) is None and tier.stats().corrupt == 2
    # a value written under other weights or layout (another fingerprint) is a miss
    other = RedisTier(tier.url, b"\x02" * 16, timeout_s=BUDGET_S)
    c = _h(3)
    tier.client.set(other.key(c), tier.client.get(tier.key(c)) or b"")
    other.put(PageGroup(b"\x02" * 16, (c,), ((0, 1, 2, 3),), "float32", SHAPE, bytes(64)))
    tier.client.set(tier.key(c), other.client.get(other.key(c)))
    assert tier.get([c]) is None and tier.stats().corrupt == 3
    other.close()


def _damage(tier: RedisTier, page_hash: bytes) -> None:
    raw = bytearray(tier.client.get(tier.key(page_hash)))
    raw[-1] ^= 0xFF  # payload bit flip: the checksum fails
    tier.client.set(tier.key(page_hash), bytes(raw))


def test_pages_before_the_first_bad_value_load_and_every_bad_value_is_deleted(tier):
    hashes = [_h(i) for i in range(100, 106)]
    g = _group(hashes)
    assert tier.put(g)
    for i in (2, 4, 5):
        _damage(tier, hashes[i])
    tier.client.set(tier.key(hashes[3]), tier.client.get(tier.key(hashes[0])))  # foreign
    got = tier.get(hashes, g.token_ids)
    assert got == g.select(hashes[:2])  # what verifies, up to the first bad page
    s = tier.stats()
    assert (s.corrupt, s.loads, s.hits, s.misses) == (4, 1, 2, 1)
    assert [tier.client.exists(tier.key(h)) for h in hashes] == [1, 1, 0, 0, 0, 0]
    assert [tier.contains(h) for h in hashes] == [True, True, False, False, False, False]
    # the recomputed pages take the freed keys (SET NX writes them again)
    assert tier.put(g)
    s = tier.stats()
    assert (s.stores, s.pages, s.skipped) == (2, 6 + 4, 2)
    assert tier.get(hashes, g.token_ids) == g and tier.stats().corrupt == 4
    # a value holding other token ids than the reader's is bad too
    wrong = (g.token_ids[0], (9, 9, 9, 9))
    assert tier.get(hashes[:2], wrong) == g.select(hashes[:1])
    assert tier.stats().corrupt == 5 and tier.client.exists(tier.key(hashes[1])) == 0


@pytest.fixture()
def full_redis(redis_server):
    """The test server out of memory under ``noeviction``: every write is refused."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    try:
        yield redis_server.url
    finally:
        client.config_set("maxmemory", "32mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()


def test_writes_redis_refuses_for_memory_are_counted_per_page(full_redis):
    t = RedisTier(full_redis, FP)
    hashes = [_h(i) for i in range(3)]
    assert t.put(_group(hashes)) is False
    assert t.put(_group(hashes[:1])) is False
    assert t.dropped == {"refused": 4, "unavailable": 0}
    s = t.stats()
    assert (s.stores, s.pages, s.failures) == (0, 0, 2)
    assert not t.degraded and t.lookup_run(hashes) == 0  # Redis answers: reads go on
    assert not any(t.contains(h) for h in hashes)  # so a later publication tries again
    t.client.config_set("maxmemory", "32mb")
    assert t.put(_group(hashes)) and t.lookup_run(hashes) == 3
    assert t.stats().pages == 3 and t.dropped["refused"] == 4
    t.close()


def test_writes_to_a_read_only_replica_are_counted_per_page(redis_server, tmp_path):
    replica = RedisServer(tmp_path)
    try:
        client = redis.Redis.from_url(replica.url)
        client.replicaof("127.0.0.1", redis_server.port)
        t = RedisTier(replica.url, FP)
        assert t.put(_group([_h(1), _h(2)])) is False
        assert t.dropped == {"refused": 2, "unavailable": 0} and not t.degraded
        t.close()
        client.close()
    finally:
        replica.stop()


def test_compute_lock_is_exclusive_and_expires(tier):
    other = RedisTier(tier.url, FP, timeout_s=BUDGET_S)
    h = _h(9)
    # a minute: a loaded machine cannot let it lapse between the two calls
    assert tier.try_lock(h, 60_000) is True
    assert other.try_lock(h, 200) is False and other.locked(h)
    assert 0 < tier.client.pttl(tier.lock_key(h)) <= 60_000  # it lapses on its own
    tier.client.pexpire(tier.lock_key(h), 1)  # the minute passes
    wait_until(lambda: not other.locked(h), "the lock to lapse")
    assert other.try_lock(h, 200) is True
    assert (tier.lock_acquired, other.lock_contended, other.lock_acquired) == (1, 1, 1)
    other.close()


def test_redis_down_degrades_without_raising():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    clock = [0.0]
    t = RedisTier(f"redis://127.0.0.1:{port}/0", FP, timeout_s=0.05, retry_s=5.0,
                  clock=lambda: clock[0])
    assert t.lookup_run([_h(1)]) == 0 and t.degraded and t.errors == 1
    assert t.put(_group([_h(1)])) is False and t.get([_h(1)]) is None
    assert t.dropped == {"refused": 0, "unavailable": 1}
    assert t.try_lock(_h(1), 100) is None
    assert t.errors == 1  # while degraded nothing is sent
    clock[0] = 6.0
    assert not t.degraded
    assert t.lookup_run([_h(1)]) == 0 and t.errors == 2
    with pytest.raises(ValueError, match="kv_store_url"):
        RedisTier("http://x", FP)
    with pytest.raises(ValueError, match="kv_store_timeout_s"):
        RedisTier("redis://x:1/0", FP, timeout_s=0)


def test_a_slow_redis_costs_one_time_budget(tier, redis_server):
    slow = RedisTier(redis_server.url, FP, timeout_s=2.0)
    slow.lookup_run([_h(1)])  # connect first
    assert not slow.degraded
    os.kill(redis_server.proc.pid, signal.SIGSTOP)  # the server stalls
    try:
        assert slow.lookup_run([_h(1)]) == 0  # times out after its budget
        assert slow.lookup_run([_h(1)]) == 0  # degraded: not sent, no second wait
        assert slow.put(_group([_h(1)])) is False
    finally:
        os.kill(redis_server.proc.pid, signal.SIGCONT)
    assert slow.degraded and slow.errors == 1  # one call ran into the budget, no more
    slow.close()
