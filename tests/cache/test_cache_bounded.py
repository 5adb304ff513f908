"""Nothing in the cache core grows with the number of requests served.

10,000 requests go through the core in rounds of one leader and three followers with
the same cold prompt: the followers poll the leader's pages as it publishes them in two
chunks, or take over when it fails its step or is aborted. Afterwards (and after a
reset) every container of the manager, pool, index and in-flight registry has exactly
its idle size: nothing is queued for requests that are gone.
"""
from __future__ import annotations

from collections import deque

from prefixcache.cache import KVCacheManager
from prefixcache.cache.cached_queues import CachedQueues
from prefixcache.cache.invariants import check_invariants

BS = 4
POOL = 24
ROUNDS = 2_500  # 4 requests each
PROMPT_LEN = 13  # 3 full pages + 1 token


def containers(mgr: KVCacheManager) -> dict[str, int]:
    """``owner.attribute -> len`` of every sized container the manager holds, also
    inside its parts (pool, index, in-flight registry, hashing, publication, hits)."""
    out = {}
    parts = [("mgr", mgr)] + [(k, v) for k, v in vars(mgr).items() if hasattr(v, "__dict__")]
    for owner, obj in parts + [("pins.demotion", mgr.pins.demotion)]:
        for name, v in vars(obj).items():
            if isinstance(v, (list, dict, set, deque, tuple, bytearray, CachedQueues)):
                out[f"{owner}.{name}"] = len(v)
    return out


def idle_sizes() -> dict[str, int]:
    return {"mgr.tables": 0,
            "pool.state": POOL, "pool.ref_count": POOL, "pool._free": POOL, "pool._lru": 0,
            "index._by_hash": 0, "index.page_hash": POOL, "index.page_key": POOL,
            "index.entry_id": POOL, "index._page_of_entry": 0,
            "inflight._owner": 0, "inflight._owned": 0,
            "pool.owner": POOL, "pool.pinned": POOL, "pool.usage": 0,
            "pins.pins": 0, "pins.pin_count": POOL, "pins._of_page": 0, "pins._expiry": 0,
            "pins.counters": 11, "quotas.fractions": 0,  # a fixed set of counters
            "pins.demotion.waiting": 0, "pins.demotion._refs": 0}


def prompt(k: int) -> list[int]:
    """Round ``k``'s prompt; 50 distinct prompts of 3 pages, more than the pool holds,
    so every round is cold and older prefixes are evicted."""
    return [1000 * (k % 50) + t for t in range(PROMPT_LEN)]


def finish(mgr: KVCacheManager, pt) -> None:
    """Prefill whatever the table still lacks, count its query, free it."""
    rest = len(pt.token_ids) - pt.num_computed_tokens
    assert mgr.allocate(pt, rest)
    mgr.commit(pt, rest)
    mgr.record_query(len(pt.token_ids), pt.num_cached_tokens, pt.num_inflight_hit_tokens)
    mgr.free(pt)


def run_round(mgr: KVCacheManager, k: int) -> None:
    toks = prompt(k)
    lead = mgr.new_page_table(f"L{k}", list(toks))
    assert mgr.take_hits(lead) == 0
    assert mgr.allocate(lead, PROMPT_LEN)  # pages 0..2 in flight, owned by the leader
    fs = [mgr.new_page_table(f"F{k}.{j}", list(toks)) for j in range(3)]
    for f in fs:
        assert mgr.take_hits(f) == 0 and mgr.next_page_owner(f) == f"L{k}" and mgr.wait(f)
    mode = k % 4
    if mode < 2:  # the leader publishes in two chunks; followers take pages as they come
        mgr.commit(lead, 4)
        assert [mgr.take_hits(f) for f in fs] == [4, 4, 4]
        assert all(mgr.next_page_owner(f) == f"L{k}" for f in fs)
        mgr.commit(lead, PROMPT_LEN - 4)
        mgr.record_query(PROMPT_LEN, 0)
        mgr.free(lead)
        assert [mgr.take_hits(f) for f in fs] == [8, 8, 8]
        for f in fs:
            finish(mgr, f)
        return
    if mode == 2:
        mgr.fail_step(lead)  # the step failed: nothing published, registrations gone
    mgr.free(lead)           # aborted (after the failure, or instead of computing)
    assert all(mgr.next_page_owner(f) is None for f in fs)
    first, rest = fs[0], fs[1:]
    assert mgr.allocate(first, PROMPT_LEN)  # takes over: now it owns the pages
    assert all(mgr.next_page_owner(f) == first.request_id for f in rest)
    mgr.commit(first, PROMPT_LEN)
    mgr.record_query(PROMPT_LEN, 0)
    mgr.free(first)
    assert [mgr.take_hits(f) for f in rest] == [12, 12]
    for f in rest:
        finish(mgr, f)


def test_ten_thousand_requests_with_followers_leave_nothing_behind():
    mgr = KVCacheManager(POOL, BS, model_id="m", root_seed="bounded")
    for k in range(ROUNDS):
        run_round(mgr, k)
        if k % 500 == 0:
            check_invariants(mgr)
    check_invariants(mgr)
    s = mgr.stats()
    # Requests that completed their prefill: 4 per normal round, 3 per taken-over one.
    assert s["prefix_cache_queries"] == PROMPT_LEN * (ROUNDS // 2 * 4 + ROUNDS // 2 * 3)
    assert s["prefix_cache_hits"] == s["inflight_hits"] == 12 * (
        ROUNDS // 2 * 3 + ROUNDS // 2 * 2)
    assert s["published_pages"] == 3 * ROUNDS and s["duplicate_pages"] == 0
    assert s["evictions"] == s["published_pages"] - s["pages_indexed"]
    assert (s["pages_live"], s["pages_inflight"]) == (0, 0)
    assert s["pages_cached"] == s["pages_indexed"] > 0
    sizes = containers(mgr)
    cached = s["pages_cached"]
    assert sizes == idle_sizes() | {"pool._free": POOL - cached, "pool._lru": cached,
                                    "pool.usage": 1,  # one tenant owns the cached pages
                                    "index._by_hash": cached,
                                    "index._page_of_entry": cached}
    report = mgr.reset()
    assert (report.dropped_pages, report.kept_in_use_pages) == (cached, 0)
    assert containers(mgr) == idle_sizes()
