"""The replay driver, TTL expiry and ``drop_cached``, the one way a cached page goes."""
from __future__ import annotations

import pytest
from cache_helpers import serve

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.driver import ReplayDriver
from prefixcache.cache.expiry import IdleExpiry
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.page_pool import PoolError

BS = 4


# -- drop_cached ------------------------------------------------------------------------

def test_drop_cached_unindexes_and_frees_the_page():
    mgr = KVCacheManager(8, BS)
    a = serve(mgr, "A", list(range(9)))            # pages 0, 1 published, then freed
    p0, p1 = mgr.pool.cached_pages()[::-1]         # freed last first: page 1 is older
    mgr.drop_cached(p1)
    assert mgr.pool.state[p1] == PageState.FREE and mgr.pool.free_pages()[-1] == p1
    assert mgr.index.page_hash[p1] is None and a.hashes[1] not in mgr.index
    assert (mgr.pool.num_cached, len(mgr.index)) == (1, 1)
    check_invariants(mgr)
    b = mgr.new_page_table("B", list(range(9)))
    assert mgr.take_hits(b) == 4 and b.pages == [p0]   # page 1 is gone: a miss
    with pytest.raises(PoolError, match=f"page {p0} is PUBLISHED"):
        mgr.drop_cached(p0)                        # held by B: never dropped
    with pytest.raises(PoolError, match=f"page {p1} is FREE"):
        mgr.drop_cached(p1)
    check_invariants(mgr)


def test_reset_and_eviction_go_through_drop_cached(monkeypatch):
    dropped = []
    real = KVCacheManager.drop_cached
    monkeypatch.setattr(KVCacheManager, "drop_cached",
                        lambda self, p, *cause: (dropped.append(p), real(self, p, *cause)))
    mgr = KVCacheManager(4, BS)
    serve(mgr, "A", list(range(9)))                # 2 cached pages, 2 free
    cached = mgr.pool.cached_pages()
    serve(mgr, "B", list(range(100, 113)))         # needs 4 pages: evicts both, LRU first
    assert dropped == cached and mgr.stats()["evictions"] == 2
    dropped.clear()
    cached = mgr.pool.cached_pages()
    assert mgr.reset().dropped_pages == 3 and dropped == cached
    assert mgr.stats()["reset_dropped_pages"] == 3 and mgr.pool.num_free == 4


# -- the driver -------------------------------------------------------------------------

def test_driver_publishes_responses_for_the_next_turn():
    mgr = KVCacheManager(16, BS)
    drv = ReplayDriver(mgr)
    a = drv.serve("A", list(range(1, 11)), response=[11, 12, 13, 14, 15])
    # 10 prompt + 4 committed response tokens: 3 full pages published.
    assert (a.cached_tokens, a.response_tokens_published, a.fits) == (0, 4, True)
    assert mgr.stats()["published_pages"] == 3 and mgr.stats()["pages_live"] == 0
    b = drv.serve("B", list(range(1, 15)) + [99])
    assert b.cached_tokens == 12 and b.table.hashes[:3] == a.table.hashes[:3]
    s = mgr.stats()
    assert (s["prefix_cache_queries"], s["prefix_cache_hits"]) == (25, 12)
    assert not mgr.tables and len(mgr.inflight) == 0


def test_driver_concurrency_holds_pages_and_too_large_requests_do_not_fit():
    mgr = KVCacheManager(6, BS)
    drv = ReplayDriver(mgr, concurrency=2)
    drv.serve("A", list(range(9)))                 # 3 pages, still running
    assert set(mgr.tables) == {"A"} and mgr.pool.num_live == 3
    b = drv.serve("B", list(range(9)))             # hits A's 2 pages while A runs
    assert b.cached_tokens == 8 and set(mgr.tables) == {"B"}
    big = drv.serve("C", list(range(500, 530)))    # 8 pages > the pool of 6
    assert (big.fits, big.cached_tokens) == (False, 0) and set(mgr.tables) == set()
    assert mgr.stats()["prefix_cache_queries"] == 9 + 9 + 30
    drv.finish()
    assert mgr.pool.num_live == 0
    check_invariants(mgr)


def test_driver_rejects_bad_arguments():
    mgr = KVCacheManager(4, BS)
    with pytest.raises(ValueError, match="concurrency"):
        ReplayDriver(mgr, concurrency=0)
    with pytest.raises(ValueError, match="expiry"):
        ReplayDriver(mgr, expiry=IdleExpiry(KVCacheManager(4, BS), 10))


# -- TTL expiry -------------------------------------------------------------------------

def test_idle_pages_expire_after_the_ttl():
    for ttl, hit, expired in ((50, 0, 2), (200, 8, 0)):
        mgr = KVCacheManager(16, BS)
        exp = IdleExpiry(mgr, ttl)
        drv = ReplayDriver(mgr, expiry=exp)
        drv.serve("A", list(range(9)), now=0.0)
        b = drv.serve("B", list(range(9)), now=100.0)
        assert (b.cached_tokens, exp.expired_pages) == (hit, expired), ttl
        assert mgr.stats()["evictions"] == 0
        check_invariants(mgr)
    with pytest.raises(ValueError, match="ttl_seconds"):
        IdleExpiry(mgr, 0)


def test_expiry_skips_pages_used_again_or_not_cached_free():
    mgr = KVCacheManager(16, BS)
    exp = IdleExpiry(mgr, 10)
    drv = ReplayDriver(mgr, expiry=exp)
    a = drv.serve("A", list(range(9)), now=0.0)
    drv.serve("B", list(range(9)), now=8.0)        # reuses A's 2 pages at t=8
    assert exp.expire(15.0) == 0                   # idle since 8, not since 0
    held = mgr.new_page_table("H", list(range(9)))
    assert mgr.take_hits(held) == 8                # held, so not cached-free
    assert exp.expire(30.0) == 0 and len(mgr.index) == 2
    mgr.free(held)
    assert exp.expire(30.0) == 0                   # its queue entries were spent
    assert a.table.hashes[0] in mgr.index
