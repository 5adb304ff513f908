"""The KV connector: one object, given to the cache manager at construction, is all the
engine has beyond the pool. Without tiers it is the null connector (nothing done, its
lookups counted); with tiers the manager, the scheduler and the engine call it, and
after close nothing reaches it."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.allocation import EvictedPage
from prefixcache.cache.connector import KVConnector, NullConnector
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.manager import KVCacheManager
from prefixcache.engine.kv_connector import TieredConnector

G = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
PROMPTS = [[1] + [(k * i) % 250 + 5 for i in range(40)] for k in (3, 7, 11)]


def gen(llm: LLM, prompts: list[list[int]]):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], G)


@pytest.mark.parametrize("kw", [{}, {"host_cache_bytes": 1 << 22,
                                     "enable_prefix_caching": False}])
def test_without_tiers_the_null_connector_does_nothing_and_counts_lookups(kw):
    llm = LLM("builtin:tiny", num_pages=64, **kw)
    eng = llm.engine
    assert type(eng.connector) is NullConnector
    assert eng.cache.connector is eng.connector is eng.scheduler.connector
    assert eng.tiers is None and eng.shared is None
    assert eng.cache._alloc.on_evict is None and not eng.cache.pins.demotion.enabled
    assert eng.cache.pins.demotion.hook is None and eng.cache.index.events is None
    gen(llm, PROMPTS)
    gen(llm, PROMPTS[:1])  # a pool hit (with caching on) is still one lookup
    s = llm.stats()
    assert s["kv_connector_null_lookups"] == 4
    assert not [k for k in s if k.startswith(("host_tier", "disk_tier", "redis", "tier_"))]
    llm.engine.close()
    assert s["kv_connector_null_lookups"] == 4 and eng.cache._alloc.on_evict is None


def test_with_a_host_tier_one_connector_is_wired_everywhere_and_close_unwires_it():
    llm = LLM("builtin:tiny", num_pages=4, host_cache_bytes=1 << 22,
              tier_load_policy="always")
    eng = llm.engine
    conn = eng.connector
    assert isinstance(conn, TieredConnector) and conn.writes_back
    assert not conn.records_events and eng.shared is None
    assert eng.cache.connector is conn is eng.scheduler.connector and eng.tiers is conn.tiers
    assert eng.cache._alloc.on_evict == conn.on_evict
    assert eng.cache.pins.demotion.enabled and eng.cache.pins.demotion.hook == conn.on_pinned
    gen(llm, PROMPTS[:1])  # 3 pages, 2 full ones published
    gen(llm, PROMPTS[1:2])  # 3 pages in a pool of 4: the first prompt's tail is evicted
    conn.flush()
    (out,) = gen(llm, PROMPTS[:1])  # its head from the pool, its tail from host RAM
    s = llm.stats()
    assert out.num_cached_tokens == 32 and s["host_tier_hit_tokens"] == 16
    assert s["tier_store_pending"] == 0 and s["pages_live"] == 0
    eng.close()
    assert conn.closed and eng.cache._alloc.on_evict is None
    assert not eng.cache.pins.demotion.enabled and eng.cache.pins.demotion.hook is None
    gen(llm, PROMPTS[1:2])  # evicts the tail again, and loads nothing any more:
    (out,) = gen(llm, PROMPTS[:1])  # the pool serves alone
    assert out.num_cached_tokens == 16 and llm.stats()["host_tier_hit_tokens"] == 16
    check_invariants(eng.cache)
    eng.close()  # idempotent


class Recorder(KVConnector):
    """Writes back; records every call the manager makes."""

    writes_back = True

    def __init__(self) -> None:
        self.bound: list[KVCacheManager] = []
        self.evicted: list[list[EvictedPage]] = []
        self.pinned: list[tuple[list[bytes], bool]] = []
        self.closes = 0

    def bind(self, cache) -> None:
        self.bound.append(cache)

    def on_evict(self, evicted):
        self.evicted.append(list(evicted))

    def on_pinned(self, hashes, pinned):
        self.pinned.append((list(hashes), pinned))

    def close(self) -> None:
        self.closes += 1


def test_the_manager_binds_its_connector_and_hands_it_evictions_and_pins():
    rec = Recorder()
    mgr = KVCacheManager(4, 2, connector=rec)
    assert rec.bound == [mgr] and mgr.connector is rec
    a = mgr.new_page_table("a", [1, 2, 3, 4, 5])
    assert mgr.allocate(a, 5)
    mgr.commit(a, 5)
    hashes = mgr.page_hashes(a, 2)
    mgr.pin(a, 2, 60.0)
    assert rec.pinned == [(hashes, True)]
    mgr.free(a)
    b = mgr.new_page_table("b", [9, 9, 9, 9, 9, 9, 9])
    assert mgr.allocate(b, 7)  # 4 pages: the 2 published (pinned) ones are evicted
    # one call per allocation, the prefix's tail first (freed last first, LRU order)
    assert [[(e.page, e.page_hash, e.token_bytes) for e in batch]
            for batch in rec.evicted] == [[(1, hashes[1], bytes([3, 0, 0, 0, 4, 0, 0, 0])),
                                           (0, hashes[0], bytes([1, 0, 0, 0, 2, 0, 0, 0]))]]
    (kept,) = mgr.pins.pins.values()  # demoted with its pages, not lapsed
    assert kept.pages == (None, None) and kept.hashes == tuple(hashes)
    mgr.close_connector()
    assert rec.closes == 1 and mgr._alloc.on_evict is None
    assert not mgr.pins.demotion.enabled
    check_invariants(mgr)


def test_a_tiered_connector_binds_one_manager_only(tmp_path):
    llm = LLM("builtin:tiny", num_pages=8, disk_cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="connector: already bound"):
        KVCacheManager(8, 16, connector=llm.engine.connector)
    llm.engine.close()
