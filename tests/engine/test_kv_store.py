"""The shared KV tier (L4) between engines on one real redis-server: a prompt computed
on replica A is a hit on replica B with the same output, never for another tenant; cold
stampedes across replicas wait for the leader (bounded); Redis down keeps serving; damaged
values load what verifies and heal in one request; every page not stored is counted by reason."""
from __future__ import annotations

import socket

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixcache import LLM, SamplingParams
from prefixcache.cache.tiers.redis_store import RedisTier
from prefixcache.server.metrics import EngineStatsCollector

G = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=3)
P = [1] + [(13 * i) % 250 + 3 for i in range(120)]  # 121 tokens: 7 full pages hit at most
HIT = (len(P) - 1) // 16 * 16


def replica(url: str, **kw) -> LLM:
    kw.setdefault("tier_load_policy", "always")
    # a time budget no loaded machine reaches by accident (the default, 0.1 s, can be)
    kw.setdefault("kv_store_timeout_s", 10.0)
    return LLM("builtin:tiny", num_pages=64, kv_store_url=url, **kw)



def _lock_first_page_and_wait(b, leader) -> None:
    """``leader`` (another replica) locks the first page of prompt ``P``; ``b`` gets the
    request and, after one step, waits on that lock instead of computing."""
    pt = b.engine.cache.new_page_table("probe", P)
    first = b.engine.cache.page_hashes(pt, 1)[0]
    b.engine.cache.free(pt)
    assert leader.try_lock(first, 60_000)
    b.engine.add_request("r1", P, G)
    assert b.engine.step() == [] and b.engine.shared.waiting == 1

def run(llm: LLM, prompt: list[int], tenant: str | None = None):
    return llm.generate([{"prompt_token_ids": prompt}], G, tenant=tenant)[0]


def flush(llm: LLM) -> None:
    assert llm.engine.shared is not None
    llm.engine.shared.queue.flush()


@pytest.fixture()
def url(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


def test_a_prompt_cold_on_a_is_a_hit_on_b_and_not_for_another_tenant(url):
    a, b = replica(url), replica(url)
    try:
        cold = run(a, P, tenant="alice")
        assert cold.num_cached_tokens == 0
        flush(a)  # stored right after publication, not at eviction
        assert a.engine.stats()["redis_tier_published_pages"] == len(P) // 16
        warm = run(b, P, tenant="alice")
        assert warm.num_cached_tokens == HIT
        assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
        for got, want in zip(warm.outputs[0].logprobs, cold.outputs[0].logprobs):
            for t in want:
                assert got[t].logprob == pytest.approx(want[t].logprob, abs=1e-4)
        s = b.engine.stats()
        assert s["redis_tier_hit_tokens"] == HIT and s["redis_tier_loads"] == 1
        # what B loaded is not stored back (its prompt has no other full page)
        assert s["redis_tier_published_pages"] == len(P) // 16 - HIT // 16
        assert run(b, P, tenant="bob").num_cached_tokens == 0  # another namespace
    finally:
        a.engine.close()
        b.engine.close()


def test_a_cold_prefix_locked_by_another_replica_is_waited_for(url):
    a, b = replica(url), replica(url, kv_store_lock_wait_s=30.0)
    leader = RedisTier(url, b.engine.tiers.fingerprint, timeout_s=10.0)
    try:
        # replica "A" holds the lock of P's first page, as if it were computing it
        first = b.engine.cache.page_hashes(
            b.engine.cache.new_page_table("probe", P, tenant="t"), 1)[0]
        b.engine.cache.free(b.engine.cache.tables["probe"])
        assert leader.try_lock(first, 30_000) is True
        b.engine.add_request("r1", P, G, tenant="t")
        for _ in range(5):  # it stays waiting: B computes nothing
            assert b.engine.step() == []
        assert b.engine.counters["prefill_tokens_computed"] == 0
        assert b.engine.stats()["redis_tier_lock_waits"] == 1
        cold = run(a, P, tenant="t")  # the leader's pages reach Redis
        flush(a)
        outs = []
        while b.engine.has_unfinished_requests():
            outs += b.engine.step()
        assert outs[-1].num_cached_tokens == HIT
        assert outs[-1].outputs[0].token_ids == cold.outputs[0].token_ids
        s = b.engine.stats()
        assert (s["redis_tier_lock_wait_hits"], s["redis_tier_lock_timeouts"]) == (1, 0)
        assert b.engine.counters["prefill_tokens_computed"] == len(P) - HIT
    finally:
        leader.close()
        a.engine.close()
        b.engine.close()


def test_a_follower_computes_itself_when_the_leader_never_delivers(url):
    b = replica(url, kv_store_lock_wait_s=5.0)
    leader = RedisTier(url, b.engine.tiers.fingerprint, timeout_s=10.0)
    clock = [0.0]
    b.engine.shared.clock = lambda: clock[0]
    try:
        _lock_first_page_and_wait(b, leader)
        clock[0] = 5.0  # past kv_store_lock_wait_s
        outs = []
        while b.engine.has_unfinished_requests():
            outs += b.engine.step()
        assert outs[-1].num_cached_tokens == 0 and outs[-1].outputs[0].finish_reason == "length"
        s = b.engine.stats()
        assert (s["redis_tier_lock_waits"], s["redis_tier_lock_timeouts"]) == (1, 1)
        assert b.engine.shared.waiting == 0 and not b.engine.shared._decided
    finally:
        leader.close()
        b.engine.close()



def test_a_follower_waits_no_longer_than_recomputing_would_take(url):
    b = replica(url, kv_store_lock_wait_s=30.0)
    leader = RedisTier(url, b.engine.tiers.fingerprint, timeout_s=10.0)
    b.engine.shared.clock = lambda: 100.0
    b.engine.shared.estimates.prefill_s_per_token = 0.001  # 1 ms per token, measured
    try:
        _lock_first_page_and_wait(b, leader)
        (wait,) = b.engine.shared._waits.values()
        assert wait.deadline - 100.0 == pytest.approx(HIT * 0.001)  # the recompute estimate
        b.engine.abort_request("r1")
    finally:
        leader.close()
        b.engine.close()

def test_redis_down_keeps_serving():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    llm = replica(f"redis://127.0.0.1:{port}/0", kv_store_timeout_s=0.05)
    try:
        first, second = run(llm, P), run(llm, P)
        assert first.outputs[0].finish_reason == second.outputs[0].finish_reason == "length"
        assert second.num_cached_tokens == HIT  # the pool still hits
        s = llm.engine.stats()
        assert s["redis_tier_degraded"] == 1.0 and s["redis_tier_errors"] >= 1
    finally:
        llm.engine.close()


def _damage(client: redis.Redis, key: bytes) -> None:
    raw = bytearray(client.get(key))
    raw[-1] ^= 0xFF  # payload bit flip: the checksum fails
    client.set(key, bytes(raw))


def test_damaged_values_load_what_verifies_and_heal_in_one_request(url):
    """Pages 2, 4 and 5 of P damaged in Redis: B loads pages 0..1, deletes all three bad
    values, recomputes from page 2 and stores the recomputed pages in their place, so C
    hits the whole prefix."""
    a, b, c = replica(url), replica(url), replica(url)
    client = redis.Redis.from_url(url)
    try:
        cold = run(a, P)
        flush(a)
        remote = a.engine.shared.remote  # type: ignore[union-attr]
        pt = a.engine.cache.new_page_table("probe", P)
        hashes = a.engine.cache.page_hashes(pt, HIT // 16)
        a.engine.cache.free(pt)
        keys = [remote.key(h) for h in hashes]
        assert client.exists(*keys) == 7
        for i in (2, 4, 5):
            _damage(client, keys[i])
        out = run(b, P)
        assert out.num_cached_tokens == 2 * 16
        assert out.outputs[0].token_ids == cold.outputs[0].token_ids
        s = b.engine.stats()
        assert s["redis_tier_corrupt"] == 3 and s["redis_tier_hit_tokens"] == 2 * 16
        assert s["failed_steps"] == 0
        flush(b)
        s = b.engine.stats()
        # B published pages 2..6: the three freed keys were written, 3 and 6 were there
        assert (s["redis_tier_pages"], s["redis_tier_skipped"]) == (3, 2)
        warm = run(c, P)
        assert warm.num_cached_tokens == HIT
        assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
        assert c.engine.stats()["redis_tier_corrupt"] == 0
    finally:
        client.close()
        for llm in (a, b, c):
            llm.engine.close()


def test_writes_redis_refuses_are_counted_per_page(url):
    """Redis out of memory under ``noeviction`` refuses every write: each published page
    is counted, by reason, and the tier keeps serving reads (it is not degraded)."""
    client = redis.Redis.from_url(url)
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")
    a = replica(url)
    try:
        out = run(a, P)
        assert out.outputs[0].finish_reason == "length"
        flush(a)
        s = a.engine.stats()
        assert s["redis_tier_published_pages"] == len(P) // 16 == 7
        assert s["redis_tier_store_dropped_refused"] == 7
        assert s["redis_tier_store_dropped_unavailable"] == 0
        assert s["redis_tier_store_dropped_queue_full"] == 0
        assert (s["redis_tier_pages"], s["redis_tier_degraded"]) == (0, 0.0)
        m = scrape(s)
        assert m['redis_tier_store_dropped_total{reason="refused"}'] == 7
        assert m['redis_tier_store_dropped_total{reason="queue_full"}'] == 0
    finally:
        client.config_set("maxmemory", "32mb")
        client.config_set("maxmemory-policy", "allkeys-lru")
        client.close()
        a.engine.close()


def test_a_full_store_queue_counts_every_page_it_drops(url):
    a = replica(url, tier_store_queue=1)
    try:
        shared = a.engine.shared
        assert shared is not None
        shared.queue.close()  # no worker: the queue fills and stays full
        run(a, P)  # its 7 pages take the one place in the queue
        run(a, [2] + P[1:])  # 7 more pages: dropped
        s = a.engine.stats()
        assert (shared.queue.submitted, shared.queue.dropped) == (1, 1)
        assert s["redis_tier_published_pages"] == 14
        assert s["redis_tier_store_dropped_queue_full"] == 7
    finally:
        a.engine.close()


def scrape(stats: dict) -> dict[str, str | float]:
    col = EngineStatsCollector()
    col.snapshot = stats
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)  # type: ignore[arg-type]
    out: dict[str, str | float] = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for sample in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out
