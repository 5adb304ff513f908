"""Agent sessions on the cache core (no model): exact pages held and released, TTL on an
injected clock, close, caps, pressure and forced evictions; invariants after each step."""
from __future__ import annotations

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.sessions import SessionRegistry
from tests.cache.cache_helpers import Clock, admit, prefill, serve

BS = 4


def tokens(k: int, n: int) -> list[int]:
    return [1000 * k + t for t in range(n)]


def setup(num_pages: int = 16, ttl: float = 60.0, **kw):
    clock = Clock()
    mgr = KVCacheManager(num_pages, BS, model_id="m", clock=clock, **kw)
    return mgr, SessionRegistry(mgr, ttl), clock


def call(mgr, reg, rid, toks, sid="s", tenant=None):
    """One session call as the engine makes it: queued, admitted with its hit, prefilled
    (the transcript is the whole token list here), renewed, kept, freed."""
    reg.enter(tenant, sid)
    pt = admit(mgr, rid, toks, tenant=tenant)
    prefill(mgr, pt)
    reg.renew(tenant, sid, pt.num_cached_tokens)
    check_invariants(mgr)
    pin = reg.keep(tenant, sid, pt)
    mgr.free(pt)
    check_invariants(mgr)
    return pt, pin


def flood(mgr, n: int, start: int = 100) -> None:
    for k in range(start, start + n):  # cold, 3 pages + 1 token each
        serve(mgr, f"f{k}", tokens(k, 3 * BS + 1))


def test_transcript_survives_a_flood_that_lru_would_evict():
    for ttl, hit in ((60.0, 4 * BS), (0.0, 0)):  # sessions on, then off (plain LRU)
        mgr, reg, _ = setup(ttl=ttl)
        t1 = tokens(1, 4 * BS + 2)
        _, pin = call(mgr, reg, "c1", t1)
        s = reg.stats()
        if ttl:
            assert pin is not None and pin.num_tokens == 4 * BS and len(pin.pages) == 4
            assert (s["sessions_live"], s["session_pages_held"], s["session_keeps"]) == (1, 4, 1)
        else:
            assert pin is None and (s["sessions_live"], s["session_pages_held"]) == (0, 0)
        flood(mgr, 12)
        assert mgr.stats()["evictions"] > 20
        pt, _ = call(mgr, reg, "c2", t1 + tokens(9, 7))
        assert pt.num_cached_tokens == hit
        s = reg.stats()
        assert (s["session_hits"], s["session_hit_tokens"]) == ((1, hit) if ttl else (0, 0))
        assert s["session_pages_evicted"] == 0


def test_renew_releases_the_old_transcript_beyond_the_new_prefix():
    mgr, reg, _ = setup()
    t1 = tokens(1, 6 * BS)  # 6 full pages kept
    _, pin1 = call(mgr, reg, "c1", t1)
    old = list(pin1.pages)
    assert len(old) == 6 and all(mgr.pool.pinned[p] for p in old)
    # Call 2 shares the first 4 pages, then diverges.
    reg.enter(None, "s")
    pt = admit(mgr, "c2", t1[:4 * BS] + tokens(2, 2 * BS + 1))
    prefill(mgr, pt)
    assert pt.num_cached_tokens == 4 * BS and pt.pages[:4] == old[:4]
    reg.renew(None, "s", pt.num_cached_tokens)
    check_invariants(mgr)
    assert not any(mgr.pool.pinned[p] for p in old)  # the old pin is gone
    assert [mgr.pool.state[p] for p in old[4:]] == [PageState.CACHED_FREE] * 2  # to LRU
    assert reg.stats()["session_pages_held"] == 0 and reg.is_live(None, "s")
    pin2 = reg.keep(None, "s", pt)
    mgr.free(pt)
    check_invariants(mgr)
    assert pin2 is not None and len(pin2.pages) == 6 and pin2.pages[:4] == tuple(old[:4])
    assert reg.stats()["session_pages_held"] == 6
    assert not any(mgr.pool.pinned[p] for p in old[4:])


def test_ttl_expiry_then_pages_age_normally():
    mgr, reg, clock = setup(ttl=30.0)
    _, pin = call(mgr, reg, "c1", tokens(1, 3 * BS + 1))
    pages = list(pin.pages)
    clock.t += 29.0
    assert reg.is_live(None, "s") and reg.stats()["session_pages_held"] == 3
    clock.t += 1.0  # expires_at <= now
    s = reg.stats()
    assert (s["sessions_live"], s["session_pages_held"]) == (0, 0)
    assert not reg.is_live(None, "s") and mgr.stats()["pins_expired"] == 1
    # Not dropped: still cached (unpinned) and a hit until LRU takes them.
    assert all(mgr.pool.state[p] == PageState.CACHED_FREE and not mgr.pool.pinned[p]
               for p in pages)
    pt, _ = call(mgr, reg, "c2", tokens(1, 3 * BS + 1) + [7])
    assert pt.num_cached_tokens == 3 * BS
    assert reg.stats()["session_hits"] == 0  # the session was not live any more


def test_close_frees_at_once_and_only_the_tenants_own():
    mgr, reg, _ = setup()
    _, pin = call(mgr, reg, "c1", tokens(1, 5 * BS + 1), tenant="a")
    pages = list(pin.pages)
    free_before = mgr.pool.num_free
    assert reg.close("b", "s") is False  # another tenant's same id is another session
    assert reg.close("a", "other") is False
    assert reg.close("a", "s") is True
    check_invariants(mgr)
    assert all(mgr.pool.state[p] == PageState.FREE for p in pages)
    assert mgr.pool.num_free == free_before + 5
    assert reg.stats()["sessions_live"] == 0 and reg.close("a", "s") is False
    assert mgr.stats()["pins"] == 0
    pt, _ = call(mgr, reg, "c2", tokens(1, 5 * BS + 1) + [3], tenant="a")
    assert pt.num_cached_tokens == 0


def test_close_keeps_pages_another_session_holds():
    mgr, reg, _ = setup()
    shared = tokens(1, 2 * BS)
    _, p1 = call(mgr, reg, "c1", shared + tokens(2, 2 * BS), sid="x")
    _, p2 = call(mgr, reg, "c2", shared + tokens(3, 2 * BS), sid="y")
    assert p1.pages[:2] == p2.pages[:2]
    assert reg.close(None, "x")
    check_invariants(mgr)
    assert [mgr.pool.state[p] for p in p1.pages] == [PageState.CACHED_FREE] * 2 + [
        PageState.FREE] * 2
    assert reg.stats()["session_pages_held"] == 4


def test_a_flood_of_one_tenants_sessions_stays_within_the_pin_cap():
    mgr, reg, _ = setup(num_pages=20, max_pinned_fraction=0.5)
    assert mgr.pins.cap_pages == 10
    for k in range(8):  # 8 sessions of 3 pages: the oldest lapse over the cap
        call(mgr, reg, f"a{k}", tokens(k, 3 * BS + 1), sid=f"s{k}", tenant="a")
        assert mgr.pins.num_pinned_pages <= 10
    s = reg.stats()
    assert (s["sessions_live"], s["session_pages_held"], s["session_keeps"]) == (3, 9, 8)
    assert [reg.is_live("a", f"s{k}") for k in range(8)] == [False] * 5 + [True] * 3
    assert mgr.stats()["pins_lapsed_for_cap"] == 5
    # Another tenant's transcript that does not fit is not kept; the call is unaffected.
    pt, pin = call(mgr, reg, "b0", tokens(50, 2 * BS + 1), sid="t", tenant="b")
    assert pin is None and reg.stats()["session_keeps_refused"] == 1
    assert pt.num_computed_tokens == 2 * BS + 1 and not reg.is_live("b", "t")


def test_a_request_succeeds_when_only_session_pages_are_left():
    mgr, reg, _ = setup(num_pages=8, max_pinned_fraction=1.0)
    _, pin = call(mgr, reg, "c1", tokens(1, 6 * BS + 1))
    assert len(pin.pages) == 6 and mgr.pool.num_free == 2
    for k in range(3):  # 2 pages each: the 2 pages not pinned are enough
        serve(mgr, f"f{k}", tokens(20 + k, BS + 1))
    assert reg.stats()["session_pages_evicted"] == 0 and reg.stats()["session_pages_held"] == 6
    pt = serve(mgr, "big", tokens(7, 7 * BS))  # needs 7 of 8 pages: 5 forced evictions
    assert pt.num_computed_tokens == 7 * BS
    s = reg.stats()
    assert s["session_pages_evicted"] == 5  # the transcript's tail first
    assert (s["sessions_live"], s["session_pages_held"]) == (1, 1)  # its head is kept
    assert reg.info(None, "s")["tokens"] == BS and mgr.pins.num_pinned_pages == 1
    check_invariants(mgr)
    again, _ = call(mgr, reg, "c2", tokens(1, 6 * BS + 1) + [5])
    assert again.num_cached_tokens == BS and reg.stats()["session_hit_tokens"] == BS


def test_abort_leaves_nothing_behind():
    mgr, reg, _ = setup()
    _, pin = call(mgr, reg, "c1", tokens(1, 3 * BS + 1))
    reg.enter(None, "s")
    pt = admit(mgr, "c2", tokens(1, 3 * BS + 1) + tokens(2, 2 * BS))
    prefill(mgr, pt)
    reg.renew(None, "s", pt.num_cached_tokens)
    reg.leave(None, "s")  # aborted: no transcript kept
    mgr.free(pt)
    check_invariants(mgr)
    s = reg.stats()
    assert (s["sessions_live"], s["session_pages_held"]) == (0, 0)
    assert mgr.stats()["pins"] == 0 and mgr.stats()["pages_live"] == 0
    assert reg.sessions == {} and not any(mgr.pool.pinned)
