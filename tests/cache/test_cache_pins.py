"""TTL pins and per-tenant quotas on the cache core (no model): exact page counts."""
from __future__ import annotations

import pytest

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.invariants import InvariantError, check_invariants
from prefixcache.cache.pins import PinCapError
from tests.cache.cache_helpers import Clock, serve

BS = 4


def prompt(k: int, pages: int) -> list[int]:
    """``pages`` full pages plus one token, distinct per ``k``."""
    return [1000 * k + t for t in range(pages * BS + 1)]


def pin_prompt(mgr, rid, tokens, ttl, **ns):
    """Serve a request and pin its full prompt pages (as the engine does)."""
    pt = serve(mgr, rid, tokens, keep=True, **ns)
    pin = mgr.pin(pt, len(tokens) // BS, ttl)
    mgr.free(pt)
    check_invariants(mgr)
    return pin


def indexed(mgr, pages) -> bool:
    return all(mgr.index.page_hash[p] is not None for p in pages)


def test_pinned_pages_survive_an_unpinned_flood():
    clock = Clock()
    mgr = KVCacheManager(16, BS, model_id="m", clock=clock)
    pin = pin_prompt(mgr, "sys", prompt(0, 4), ttl=60)
    assert pin.num_tokens == 16 and len(pin.pages) == 4
    assert all(mgr.pool.pinned[p] for p in pin.pages)
    for k in range(1, 40):  # 39 cold prompts of 3 pages + 1 token: 4 pages each
        serve(mgr, f"f{k}", prompt(k, 3))
    assert indexed(mgr, pin.pages)
    s = mgr.stats()
    assert s["evictions"] > 100 and (s["pins"], s["pages_pinned"]) == (1, 4)
    assert set(mgr.pool.cached_pages()[-4:]) == set(pin.pages)  # pinned: last to go
    # The prefix still hits: 4 pages of the pinned 17-token prompt.
    assert serve(mgr, "again", prompt(0, 4) + [7] * 3).num_cached_tokens == 16


def test_without_a_pin_the_same_flood_evicts_the_prefix():
    mgr = KVCacheManager(16, BS, model_id="m")
    serve(mgr, "sys", prompt(0, 4))
    for k in range(1, 40):
        serve(mgr, f"f{k}", prompt(k, 3))
    assert serve(mgr, "again", prompt(0, 4) + [7] * 3).num_cached_tokens == 0


def test_pin_flood_stays_within_the_cap():
    clock = Clock()
    mgr = KVCacheManager(20, BS, model_id="m", max_pinned_fraction=0.5, clock=clock)
    assert mgr.pins.cap_pages == 10
    for k in range(12):  # each pins 3 pages; a tenant's oldest pins lapse over the cap
        pin_prompt(mgr, f"p{k}", prompt(k, 3), ttl=60, tenant="a")
        assert mgr.pins.num_pinned_pages <= 10
    s = mgr.stats()
    assert (s["pins"], s["pages_pinned"], s["pins_lapsed_for_cap"]) == (3, 9, 9)
    assert [p.prefix_hash for p in mgr.pins.list("a")] == [
        p.prefix_hash for p in sorted(mgr.pins.pins.values(), key=lambda p: p.seq)]
    # Another tenant cannot take what "a" holds: refused, and "a" keeps its pins.
    pin_prompt(mgr, "b0", prompt(50, 1), ttl=60, tenant="b")  # 1 page fits (9 + 1)
    with pytest.raises(PinCapError):
        pin_prompt(mgr, "b1", prompt(51, 2), ttl=60, tenant="b")
    s = mgr.stats()
    assert (s["pins"], s["pages_pinned"], s["pins_refused"]) == (4, 10, 1)
    # Admission is never starved: 10 unpinned pages are always allocatable.
    big = serve(mgr, "big", prompt(60, 9), keep=True)  # 10 pages
    assert len(big.pages) == 10
    mgr.free(big)
    check_invariants(mgr)


def test_ttl_expiry_is_lazy_and_a_hit_refreshes_it():
    clock = Clock()
    mgr = KVCacheManager(12, BS, model_id="m", clock=clock)
    pin = pin_prompt(mgr, "sys", prompt(0, 2), ttl=10)
    assert pin.expires_at == 1010.0
    clock.t = 1008.0  # a hit on the pin's last page refreshes it to now + ttl
    assert serve(mgr, "hit", prompt(0, 2) + [5]).num_cached_tokens == 8
    assert pin.expires_at == 1018.0 and mgr.stats()["pin_refreshes"] == 1
    clock.t = 1015.0  # a hit on the first page only does not refresh
    assert serve(mgr, "part", prompt(0, 1) + [5]).num_cached_tokens == 4
    assert pin.expires_at == 1018.0
    clock.t = 1030.0  # expired, but lazily: nothing happens until someone looks
    assert len(mgr.pins) == 1 and mgr.pool.pinned[pin.pages[0]]
    assert mgr.pins.list(None) == []  # listing collects it
    assert len(mgr.pins) == 0 and not any(mgr.pool.pinned)
    assert indexed(mgr, pin.pages)  # expiry unpins: the pages stay cached
    assert mgr.stats()["pins_expired"] == 1
    check_invariants(mgr)


def test_refreshes_and_repins_keep_one_expiry_entry_per_pin():
    clock = Clock()
    mgr = KVCacheManager(12, BS, model_id="m", clock=clock)
    pin = pin_prompt(mgr, "sys", prompt(0, 2), ttl=10)
    for i in range(200):
        clock.t += 1
        serve(mgr, f"hit{i}", prompt(0, 2) + [5])
        mgr.pins.unpin(None, b"nothing")
    assert pin.expires_at == clock.t + 10 and len(mgr.pins._expiry) == 1
    for i in range(100):  # unpin and pin again: removed pins' entries are compacted
        mgr.pins.unpin(None, pin.prefix_hash)
        pin = pin_prompt(mgr, f"re{i}", prompt(0, 2), ttl=10)
    assert len(mgr.pins._expiry) <= 2 * len(mgr.pins) + 16
    clock.t += 11
    assert mgr.pins.expire() == 1 and len(mgr.pins) == 0


def test_an_expired_pin_is_collected_before_its_pages_would_be_evicted():
    clock = Clock()
    mgr = KVCacheManager(8, BS, model_id="m", clock=clock)
    pin = pin_prompt(mgr, "sys", prompt(0, 2), ttl=10)
    serve(mgr, "other", prompt(1, 2))  # 2 unpinned cached pages, 2 free... then pressure
    clock.t = 2000.0
    serve(mgr, "big", prompt(2, 6))  # 7 pages: evicts the unpinned, then the lapsed pin's
    s = mgr.stats()
    assert (s["pins"], s["pins_expired"], s["pins_evicted"]) == (0, 1, 0)
    assert not indexed(mgr, pin.pages)


def test_pressure_beyond_unpinned_pages_evicts_pinned_ones_and_the_pin_lapses():
    clock = Clock()
    mgr = KVCacheManager(8, BS, model_id="m", clock=clock)
    pin_prompt(mgr, "sys", prompt(0, 2), ttl=100)
    serve(mgr, "big", prompt(2, 7))  # needs all 8 pages
    s = mgr.stats()
    assert (s["pins"], s["pins_evicted"], s["pages_pinned"]) == (0, 1, 0)
    check_invariants(mgr)


def test_unpin_and_list_are_per_tenant_and_repinning_extends():
    clock = Clock()
    mgr = KVCacheManager(16, BS, model_id="m", clock=clock)
    a = pin_prompt(mgr, "a", prompt(0, 2), ttl=10, tenant="a")
    b = pin_prompt(mgr, "b", prompt(0, 2), ttl=10, tenant="b")
    assert a.prefix_hash != b.prefix_hash  # the tenant is in the chain root
    assert mgr.pins.unpin("b", a.prefix_hash) is False
    assert [p.prefix_hash for p in mgr.pins.list("a")] == [a.prefix_hash]
    again = pin_prompt(mgr, "a2", prompt(0, 2), ttl=30, tenant="a")
    assert again is a and a.expires_at == 1030.0 and len(mgr.pins) == 2
    assert mgr.pins.unpin("a", a.prefix_hash) is True
    assert [p.prefix_hash for p in mgr.pins.list("b")] == [b.prefix_hash]
    assert mgr.pins.list("a") == [] and not any(mgr.pool.pinned[p] for p in a.pages)
    with pytest.raises(ValueError, match="ttl_s"):
        pin_prompt(mgr, "neg", prompt(3, 1), ttl=-1)
    check_invariants(mgr)


def test_reset_drops_pinned_cached_pages_and_their_pins():
    mgr = KVCacheManager(8, BS, model_id="m")
    pin_prompt(mgr, "sys", prompt(0, 2), ttl=100)
    assert mgr.reset().dropped_pages == 2
    assert (len(mgr.pins), mgr.stats()["pins_evicted"]) == (0, 1)
    check_invariants(mgr)


@pytest.mark.parametrize("quota", [0.5, None])
def test_a_quota_holds_under_another_tenants_flood(quota):
    mgr = KVCacheManager(16, BS, model_id="m", tenant_quota_fraction=quota)
    b = serve(mgr, "b", prompt(0, 6), keep=True, tenant="b")
    b_pages = list(b.pages[:6])  # 6 published pages (the 7th is freed)
    mgr.free(b)
    for k in range(1, 30):  # tenant a floods: 29 cold prompts of 4 pages each
        serve(mgr, f"a{k}", prompt(k, 3), tenant="a")
        check_invariants(mgr)
    usage = mgr.pool.usage
    if quota is None:  # the flood evicts everything of b's
        assert not indexed(mgr, b_pages) and usage["b"] == 0
        return
    # a fills the free pages (16 - 6 = 10), then recycles only its own; its last
    # request's partial page went back to the free queue.
    assert indexed(mgr, b_pages) and usage["b"] == 6 and usage["a"] == 9
    # 3 new cached pages per request: 3 requests fill a to 9, the other 26 evict 3 each
    assert mgr.pool.num_free == 1 and mgr.stats()["evictions"] == 26 * 3
    assert serve(mgr, "b2", prompt(0, 6) + [1], tenant="b").num_cached_tokens == 24
    # b, under its quota, evicts from a (over its quota of 8) rather than itself.
    serve(mgr, "b3", prompt(40, 1), tenant="b")
    assert indexed(mgr, b_pages) and usage["a"] == 8 and usage["b"] == 7


def test_tenant_over_quota_evicts_its_own_pinned_page_before_others():
    mgr = KVCacheManager(8, BS, model_id="m", tenant_quotas={"a": 0.25, "b": 0.75})
    q = mgr.quotas
    assert (q.limit("a"), q.limit("b"), q.limit("c")) == (2, 6, None)
    serve(mgr, "b", prompt(0, 5), tenant="b")  # 5 cached pages of b
    pin_prompt(mgr, "a", prompt(1, 2), ttl=100, tenant="a")  # a at its quota, pinned
    assert (mgr.pool.num_free, mgr.pool.usage["a"]) == (1, 2)
    # 2 pages: the free one, then a (at its quota) evicts its own pinned page rather
    # than b's unpinned ones: a tenant's pins live within its share.
    serve(mgr, "a2", prompt(2, 1), tenant="a")
    s = mgr.stats()
    assert (s["pins"], s["pins_evicted"], mgr.pool.usage["b"], mgr.pool.usage["a"]) == (
        0, 1, 5, 2)


def test_bad_fractions_name_the_parameter():
    with pytest.raises(ValueError, match="max_pinned_fraction"):
        KVCacheManager(8, BS, max_pinned_fraction=1.5)
    with pytest.raises(ValueError, match="tenant_quota_fraction"):
        KVCacheManager(8, BS, tenant_quota_fraction=0)
    with pytest.raises(ValueError, match="'x'"):
        KVCacheManager(8, BS, tenant_quotas={"x": 2.0})


def test_pin_of_unpublished_pages_is_refused():
    mgr = KVCacheManager(8, BS, model_id="m")
    pt = mgr.new_page_table("r", prompt(0, 2))
    with pytest.raises(ValueError, match="pages"):
        mgr.pin(pt, 2, 10)
    assert mgr.pool.state.count(PageState.FREE) == 8


def test_the_invariants_catch_a_page_held_across_tenants():
    mgr = KVCacheManager(16, BS, model_id="m")
    a = serve(mgr, "a", prompt(1, 2), keep=True, tenant="alice")
    b = serve(mgr, "b", prompt(1, 2), keep=True, tenant="bob")
    assert not set(a.pages) & set(b.pages)  # same tokens, other namespace: no sharing
    check_invariants(mgr)
    b.pages[0], saved = a.pages[0], b.pages[0]  # as a leak across namespaces would
    with pytest.raises(InvariantError, match="belongs to tenant 'alice', the table to 'bob'"):
        check_invariants(mgr)
    b.pages[0] = saved
