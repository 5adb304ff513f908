"""In-flight registry: register, publish and withdraw; what a polling follower sees."""
from __future__ import annotations

from cache_helpers import admit, prefill, serve

from prefixcache.cache import InflightRegistry, KVCacheManager, PageState
from prefixcache.cache.invariants import check_invariants

BS = 4
PROMPT = list(range(100, 113))  # 3 full pages + 1 token


# -- the registry on its own ------------------------------------------------------------

def test_registry_register_and_release():
    reg = InflightRegistry()
    assert reg.register(b"h1", "A") and reg.register(b"h1", "A")
    assert not reg.register(b"h1", "B")
    assert reg.owner(b"h1") == "A" and len(reg) == 1 and list(reg) == [b"h1"]
    assert reg.release(b"h1")
    assert reg.owner(b"h1") is None and len(reg) == 0
    assert not reg.release(b"h1")
    assert reg.register(b"h1", "B") and reg.owner(b"h1") == "B"   # free to own again


def test_registry_withdraw_drops_every_page_of_the_owner():
    reg = InflightRegistry()
    reg.register(b"h1", "A")
    reg.register(b"h2", "A")
    reg.register(b"h3", "Z")
    assert reg.withdraw("A") == 2 and reg.withdraw("A") == 0
    assert reg.owner(b"h1") is None and reg.owner(b"h2") is None
    assert reg.owner(b"h3") == "Z" and len(reg) == 1
    assert reg.release(b"h3") and len(reg) == 0
    assert reg._owner == {} and reg._owned == {}                  # nothing left behind


# -- through the manager ----------------------------------------------------------------

def leader_and_follower(mgr: KVCacheManager):
    a = admit(mgr, "A", PROMPT)
    assert mgr.allocate(a, 13)                     # registers pages 0..2 in flight
    f = admit(mgr, "F", PROMPT)
    assert f.num_cached_tokens == 0
    assert mgr.next_page_owner(f) == "A"
    assert mgr.wait(f)
    return a, f


def test_follower_waits_then_takes_published_pages():
    mgr = KVCacheManager(16, BS)
    a, f = leader_and_follower(mgr)
    assert mgr.stats()["pages_inflight"] == 3
    assert mgr.peek_hits(f) == 0 and mgr.peek_inflight(f, 0)
    mgr.commit(a, 13)
    assert mgr.next_page_owner(f) is None and not mgr.wait(f)
    assert mgr.stats()["pages_inflight"] == 0 and mgr.peek_hits(f) == 12
    assert mgr.take_hits(f) == 12
    assert (f.num_cached_tokens, f.num_inflight_hit_tokens) == (12, 12)
    assert f.pages == a.pages[:3]
    prefill(mgr, f)
    mgr.record_query(13, 0)  # the leader's query
    assert mgr.stats()["inflight_hits"] == 12 and mgr.stats()["prefix_cache_hits"] == 12
    check_invariants(mgr)


def test_follower_follows_chunked_prefill_page_by_page():
    mgr = KVCacheManager(16, BS)
    a, f = leader_and_follower(mgr)
    mgr.commit(a, 4)                               # chunk 1: page 0 published
    assert mgr.inflight.owner(f.hashes[0]) is None and len(mgr.inflight) == 2
    assert mgr.take_hits(f) == 4
    assert mgr.next_page_owner(f) == "A" and mgr.wait(f)
    assert mgr.take_hits(f) == 0                   # polling while page 1 is in flight
    mgr.commit(a, 9)
    assert mgr.next_page_owner(f) is None and len(mgr.inflight) == 0
    assert mgr.take_hits(f) == 8
    assert f.num_inflight_hit_tokens == 12 and mgr.next_page_owner(f) is None


def test_leader_failed_step_publishes_nothing_and_the_follower_takes_over():
    mgr = KVCacheManager(16, BS)
    a, f = leader_and_follower(mgr)
    mgr.fail_step(a)
    assert mgr.next_page_owner(f) is None and not mgr.wait(f)
    assert mgr.stats()["pages_inflight"] == 0 and len(mgr.index) == 0
    assert a.num_computed_tokens == 0 and len(a.pages) == 4
    assert all(mgr.pool.state[p] == PageState.PENDING for p in a.pages)
    assert mgr.take_hits(f) == 0 and mgr.next_page_owner(f) is None
    check_invariants(mgr)
    # The follower takes over and becomes the owner; the leader retries and follows.
    assert mgr.allocate(f, 13) and mgr.inflight.owner(f.hashes[0]) == "F"
    mgr.commit(f, 13)
    assert mgr.stats()["published_pages"] == 3
    assert mgr.allocate(a, 13)                     # retry: nothing to register now
    assert mgr.stats()["pages_inflight"] == 0
    mgr.commit(a, 13)
    assert mgr.stats()["duplicate_pages"] == 3
    check_invariants(mgr)


def test_leader_abort_and_preemption_release_the_follower():
    for how in ("abort", "preempt"):
        mgr = KVCacheManager(16, BS)
        a, f = leader_and_follower(mgr)
        mgr.free(a)
        assert mgr.next_page_owner(f) is None and mgr.take_hits(f) == 0, how
        assert len(mgr.inflight) == 0 and mgr.stats()["pages_live"] == 0
        if how == "preempt":  # re-admitted later, it follows the old follower
            a2 = admit(mgr, "A", PROMPT)
            assert mgr.allocate(f, 13) and mgr.next_page_owner(a2) == "F"
        check_invariants(mgr)


def test_follower_that_ends_leaves_nothing_behind():
    mgr = KVCacheManager(16, BS)
    a, f = leader_and_follower(mgr)
    mgr.free(f)
    assert mgr.inflight.owner(f.hashes[0]) == "A" and len(mgr.inflight) == 3
    assert mgr.commit(a, 13) == 3 and len(mgr.inflight) == 0
    assert mgr.inflight._owner == {} and mgr.inflight._owned == {}
    check_invariants(mgr)


def test_publication_by_a_non_owner_completes_the_registration():
    """Regression: a request that computed the same pages without following (here a
    prompt-logprobs request) publishes them first. The follower must see them at once,
    and the hash must not stay both published and in flight."""
    mgr = KVCacheManager(16, BS)
    a, f = leader_and_follower(mgr)
    b = admit(mgr, "B", PROMPT, read_cache=False)
    assert mgr.allocate(b, 13)
    assert mgr.commit(b, 13) == 3
    assert mgr.next_page_owner(f) is None and len(mgr.inflight) == 0
    check_invariants(mgr)
    assert mgr.take_hits(f) == 12 and f.pages == b.pages[:3]
    mgr.commit(a, 13)                              # the leader's pages are duplicates
    assert len(mgr.inflight) == 0 and mgr.stats()["duplicate_pages"] == 3
    check_invariants(mgr)


def test_unpublishable_page_is_withdrawn():
    """Regression: the owner of an in-flight page whose chain can no longer be published
    (it ran through a page evicted meanwhile) withdraws it, so the follower computes."""
    mgr = KVCacheManager(12, BS)
    a = admit(mgr, "A", PROMPT)
    b = admit(mgr, "B", PROMPT)
    assert mgr.allocate(a, 13) and mgr.allocate(b, 13)
    mgr.commit(a, 13)
    mgr.commit(b, 13)                              # B's pages duplicate A's
    mgr.free(a)
    serve(mgr, "C", list(range(7000, 7032)))       # evicts A's pages
    assert mgr.counters.evictions == 3
    nxt = PROMPT + [7, 7, 7, 9]
    d = admit(mgr, "D", nxt)
    assert mgr.allocate(d, 12)                     # D recomputes pages 0..2
    mgr.commit(d, 12)
    for t in (7, 7):
        b.token_ids.append(t)
        assert mgr.allocate(b, 1)
        mgr.commit(b, 1)
    b.token_ids.append(7)
    assert mgr.allocate(b, 1)                      # B registers page 3 in flight
    assert mgr.inflight.owner(mgr.page_hashes(b, 4)[3]) == "B"
    assert mgr.next_page_owner(d) == "B" and mgr.wait(d)
    assert mgr.commit(b, 1) == 0                   # dead chain: not published
    assert mgr.inflight.owner(b.hashes[3]) is None and mgr.next_page_owner(d) is None
    assert mgr.take_hits(d) == 0
    check_invariants(mgr)


def test_decode_pages_are_registered_and_published():
    mgr = KVCacheManager(16, BS)
    a = serve(mgr, "A", [1, 2, 3, 4, 5, 6], keep=True)
    assert a.num_computed_tokens == 6 and mgr.stats()["published_pages"] == 1
    a.token_ids += [7, 8]                          # two tokens in one step
    assert mgr.allocate(a, 2)
    mgr.commit(a, 1)                               # (a partial commit)
    assert mgr.inflight.owner(mgr.page_hashes(a, 2)[1]) == "A"
    mgr.commit(a, 1)
    assert mgr.stats()["published_pages"] == 2 and len(mgr.inflight) == 0
    assert mgr.pool.state[a.pages[1]] == PageState.PUBLISHED
