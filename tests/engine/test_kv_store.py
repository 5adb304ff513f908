"""The shared KV tier (L4) between engines on one real redis-server: a prompt computed
on replica A is a hit on replica B with the same output, never for another tenant; cold
stampedes across replicas wait for the leader (bounded); Redis down keeps serving."""
from __future__ import annotations

import socket

import pytest
import redis

from prefixcache import LLM, SamplingParams
from prefixcache.cache.tiers.redis_store import RedisTier

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
