"""Page-level behaviour of the cache core: boundaries, namespaces, collisions, eviction,
LRU order, decode pages, reset, multimodal pages, counters."""
from __future__ import annotations

import pytest
from cache_helpers import admit, cached_tokens, find_colliding_page, prefill, serve, weak_hash

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.hashing import tokens_to_bytes
from prefixcache.cache.invariants import check_invariants

BS = 16


def toks(n: int, base: int = 1000) -> list[int]:
    return list(range(base, base + n))


# -- page boundaries -----------------------------------------------------------------------

@pytest.mark.parametrize("caching, expected", [
    (True, [0, 0, 16, 16, 16, 32]),
    (False, [0, 0, 0, 0, 0, 0]),
])
def test_page_boundaries_second_sending(caching, expected):
    got = []
    for n in (15, 16, 17, 31, 32, 33):
        mgr = KVCacheManager(64, BS, enable_prefix_caching=caching)
        assert cached_tokens(mgr, "first", toks(n)) == 0
        got.append(cached_tokens(mgr, "second", toks(n)))
        assert mgr.stats()["prefix_cache_hits"] == got[-1]
        assert mgr.stats()["prefix_cache_queries"] == 2 * n
    assert got == expected


@pytest.mark.parametrize("n", [1, 15, 16, 17, 31, 32, 33, 48, 64])
def test_prompt_sent_three_times_never_fully_cached(n):
    mgr = KVCacheManager(64, BS)
    got = [cached_tokens(mgr, f"r{k}", toks(n)) for k in range(3)]
    assert got[0] == 0
    assert got[1] == got[2] == (n - 1) // BS * BS
    assert all(c <= n - 1 for c in got)


def test_concurrent_identical_prompts_hit_while_first_runs():
    mgr = KVCacheManager(64, BS)
    a = serve(mgr, "a", toks(40), keep=True)
    b = serve(mgr, "b", toks(40), keep=True)
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 32)
    assert b.pages[:2] == a.pages[:2] and b.pages[2] != a.pages[2]
    assert [mgr.pool.ref_count[p] for p in a.pages] == [2, 2, 1]


# -- namespaces (each pair: the same namespace hits, so caching is really on) ----------------

NAMESPACE_PAIRS = [
    ("tenant", dict(tenant="acme"), dict(tenant="acme"), dict(tenant="other")),
    ("salt", dict(tenant="acme", cache_salt="s1"), dict(tenant="acme", cache_salt="s1"),
     dict(tenant="acme", cache_salt="s2")),
    ("no-salt vs salt", dict(tenant="acme"), dict(tenant="acme"),
     dict(tenant="acme", cache_salt="")),
    ("adapter", dict(extra_keys=("adapter", "a", 1)), dict(extra_keys=("adapter", "a", 1)),
     dict(extra_keys=("adapter", "b", 1))),
    ("adapter version", dict(extra_keys=("adapter", "a", 1)),
     dict(extra_keys=("adapter", "a", 1)), dict(extra_keys=("adapter", "a", 2))),
    ("base vs adapter", dict(), dict(), dict(extra_keys=("adapter", "a", 1))),
    ("adapter x vs salt x", dict(extra_keys=("adapter", "x", 1)),
     dict(extra_keys=("adapter", "x", 1)), dict(cache_salt="x")),
]


@pytest.mark.parametrize("name, first, same, other", NAMESPACE_PAIRS,
                         ids=[p[0] for p in NAMESPACE_PAIRS])
def test_namespace_pairs(name, first, same, other):
    mgr = KVCacheManager(64, BS)
    prompt = toks(50)
    assert cached_tokens(mgr, "warm", prompt, **first) == 0
    assert cached_tokens(mgr, "other", prompt, **other) == 0
    assert cached_tokens(mgr, "same", prompt, **same) == 48


@pytest.mark.parametrize("name, first, same, other", NAMESPACE_PAIRS,
                         ids=[p[0] for p in NAMESPACE_PAIRS])
def test_namespace_pairs_with_caching_off_get_nothing(name, first, same, other):
    mgr = KVCacheManager(64, BS, enable_prefix_caching=False)
    prompt = toks(50)
    for rid, ns in (("warm", first), ("other", other), ("same", same)):
        assert cached_tokens(mgr, rid, prompt, **ns) == 0
    assert mgr.stats()["pages_indexed"] == 0


def test_other_model_id_does_not_share():
    a = KVCacheManager(64, BS, model_id="m1", root_seed="s")
    b = KVCacheManager(64, BS, model_id="m2", root_seed="s")
    pa = a.new_page_table("x", toks(20))
    pb = b.new_page_table("x", toks(20))
    assert a.page_hashes(pa, 1) != b.page_hashes(pb, 1)


# -- forced hash collisions -----------------------------------------------------------------

def test_weak_hash_collision_on_first_page_never_shares_kv():
    mgr = KVCacheManager(32, BS, hash_fn=weak_hash)
    a_page = toks(BS, 100)
    b_page = find_colliding_page(mgr, a_page)
    a_prompt, b_prompt = a_page + [7], b_page + [7]
    a = serve(mgr, "a", a_prompt, keep=True)          # a holds its published page
    b = serve(mgr, "b", b_prompt, keep=True)
    assert a.hashes[0] == b.hashes[0]
    assert b.num_cached_tokens == 0 and b.pages[0] != a.pages[0]
    assert mgr.index.collisions == 1
    # b could not publish over a live page: its page stays private.
    assert mgr.pool.state[b.pages[0]] == PageState.PENDING
    assert mgr.index.get(a.hashes[0]) == a.pages[0]
    a_page_id = a.pages[0]
    mgr.free(a)
    mgr.free(b)
    check_invariants(mgr)
    # a's page is cached-free now: b's next sending still misses (never a's KV) and,
    # as a true collision nobody holds, replaces it.
    b2 = serve(mgr, "b2", b_prompt, keep=True)
    assert b2.num_cached_tokens == 0
    assert b2.pages[0] not in (a_page_id,)
    assert mgr.index.get(b2.hashes[0]) == b2.pages[0]
    # a's prompt misses now; b's prompt hits b2's page, never a's.
    assert cached_tokens(mgr, "a3", a_prompt) == 0   # b2 is live: a3 cannot replace it
    b2_page = b2.pages[0]
    mgr.free(b2)
    b3 = serve(mgr, "b3", b_prompt, keep=True)
    assert b3.num_cached_tokens == 16 and b3.pages[0] == b2_page != a_page_id
    mgr.free(b3)
    check_invariants(mgr)


def test_weak_hash_collision_on_parent_page_does_not_reach_old_child():
    """Pages 0 collide, pages 1 are equal tokens, so their hashes are equal too. The
    child published after the old parent must never be served on the new parent: the
    key's parent is the exact parent entry, not its hash."""
    mgr = KVCacheManager(32, BS, hash_fn=weak_hash)
    a0 = toks(BS, 100)
    b0 = find_colliding_page(mgr, a0)
    shared1 = toks(BS, 500)
    a_prompt, b_prompt = a0 + shared1 + [7], b0 + shared1 + [7]
    a = serve(mgr, "a", a_prompt)
    a_child = mgr.index.get(a.hashes[1])
    assert mgr.pool.state[a_child] == PageState.CACHED_FREE
    b = serve(mgr, "b", b_prompt, keep=True)
    assert b.hashes[:2] == a.hashes[:2]
    assert b.num_cached_tokens == 0
    assert a_child not in b.pages
    # b's pages replaced a's stale entries under both hashes.
    assert [mgr.index.get(h) for h in b.hashes[:2]] == b.pages[:2]
    b_pages = b.pages[:2]
    mgr.free(b)
    c = serve(mgr, "c", b_prompt, keep=True)
    assert c.num_cached_tokens == 32 and c.pages[:2] == b_pages
    assert cached_tokens(mgr, "a2", a_prompt) == 0
    mgr.free(c)
    check_invariants(mgr)


def test_weak_hash_collision_replaced_parent_leaves_old_child_unreachable():
    """b0 collides with a0 and replaces it while a's child page stays indexed under the
    same hash that b0 + s1 produces. A request b0 + s1 must not reach that child: its KV
    was computed after a0. (A lookup verifying only tokens and extra keys would serve
    it; the parent ref is the exact parent entry.)"""
    mgr = KVCacheManager(32, BS, hash_fn=weak_hash)
    a0 = toks(BS, 100)
    b0 = find_colliding_page(mgr, a0)
    s1 = toks(BS, 500)
    a = serve(mgr, "a", a0 + s1 + [7])
    a_child = mgr.index.get(a.hashes[1])
    b = serve(mgr, "b", b0 + [7])                  # replaces a0 (cached-free, collision)
    assert mgr.index.page_key[mgr.index.get(b.hashes[0])][1] == tokens_to_bytes(b0)
    assert mgr.index.get(a.hashes[1]) == a_child   # the old child is still indexed
    c = admit(mgr, "c", b0 + s1 + [7])
    assert c.hashes[1] == a.hashes[1]
    assert c.num_cached_tokens == 16 and a_child not in c.pages
    prefill(mgr, c)
    # c's own page 1 supersedes the unreachable child; later requests hit c's pages.
    assert mgr.index.get(c.hashes[1]) == c.pages[1]
    c_pages = c.pages[:2]
    mgr.free(c)
    d = serve(mgr, "d", b0 + s1 + [7], keep=True)
    assert d.num_cached_tokens == 32 and d.pages[:2] == c_pages
    mgr.free(d)
    assert cached_tokens(mgr, "a2", a0 + s1 + [7]) == 0
    check_invariants(mgr)


def test_weak_hash_collision_mid_chain_keeps_chains_apart():
    mgr = KVCacheManager(32, BS, hash_fn=weak_hash)
    p0 = toks(BS, 100)
    a1 = toks(BS, 300)
    b1 = find_colliding_page(mgr, a1, prefix=p0)
    a = serve(mgr, "a", p0 + a1 + [1], keep=True)
    b = serve(mgr, "b", p0 + b1 + [1], keep=True)
    assert b.num_cached_tokens == 16           # page 0 shared, page 1 collides
    assert b.pages[0] == a.pages[0] and b.pages[1] != a.pages[1]
    assert mgr.index.collisions == 1
    mgr.free(a)
    mgr.free(b)
    check_invariants(mgr)


# -- eviction under pressure and LRU order ---------------------------------------------------

def test_eviction_under_pressure_spares_live_pages():
    mgr = KVCacheManager(8, BS)
    shared = toks(48, 1000)
    q = toks(32, 5000) + [1]
    serve(mgr, "warm", shared + [1])       # 3 published pages, cached-free
    serve(mgr, "q", q)                     # 2 more cached-free pages (q0, q1)
    q_hashes = mgr.new_page_table("probe", list(q)).hashes
    mgr.free(mgr.tables["probe"])
    running = admit(mgr, "running", shared + [2, 3])
    assert running.num_cached_tokens == 48
    assert mgr.allocate(running, 2)
    live = list(running.pages)
    assert [mgr.pool.state[p] for p in live] == [PageState.PUBLISHED] * 3 + [PageState.PENDING]
    assert mgr.stats()["pages_free"] == 2 and mgr.stats()["pages_cached"] == 2
    # 4 pages for a new request: 2 free, then the 2 cached-free pages of q (tail first).
    probe = mgr.new_page_table("qh", list(q))
    qh = mgr.page_hashes(probe, 2)
    mgr.free(probe)
    q_pages = [mgr.index.get(h) for h in qh]
    big = admit(mgr, "big", toks(60, 9000))
    assert mgr.allocate(big, 60)
    assert mgr.counters.evictions == 2
    assert set(q_pages) <= set(big.pages)
    assert all(h not in mgr.index for h in qh)
    assert running.pages == live
    assert [mgr.pool.state[p] for p in live] == [PageState.PUBLISHED] * 3 + [PageState.PENDING]
    assert [mgr.pool.ref_count[p] for p in live] == [1, 1, 1, 1]
    assert all(mgr.index.get(h) == p for h, p in zip(running.hashes, live))
    # Nothing left to evict: the pool refuses instead of touching live pages.
    other = admit(mgr, "other", toks(20, 20000))
    assert not mgr.allocate(other, 20)
    assert other.pages == [] and mgr.counters.evictions == 2
    check_invariants(mgr)
    mgr.commit(running, 2)
    mgr.commit(big, 60)
    for pt in (running, big, other):
        mgr.free(pt)
    check_invariants(mgr)
    assert q_hashes == []  # tables only hash on demand
    assert cached_tokens(mgr, "q-again", q) == 0
    assert mgr.stats()["pages_live"] == 0


def test_lru_evicts_tail_pages_before_head_pages():
    mgr = KVCacheManager(8, BS)
    prompt = toks(64) + [1]               # 4 full pages + 1 token
    a = serve(mgr, "a", prompt)
    probe = mgr.new_page_table("p", list(prompt))
    hashes = mgr.page_hashes(probe, 4)
    mgr.free(probe)
    pages = [mgr.index.get(h) for h in hashes]
    # Freed last first: the least recently used page is the tail.
    assert mgr.pool.cached_pages() == pages[::-1]
    assert a.pages == []
    # 5 free pages remain; taking 6 evicts exactly the tail page.
    x = admit(mgr, "x", toks(96, 7000))
    assert mgr.allocate(x, 96)
    assert mgr.counters.evictions == 2
    assert hashes[3] not in mgr.index and hashes[2] not in mgr.index
    assert hashes[0] in mgr.index and hashes[1] in mgr.index
    mgr.commit(x, 96)
    mgr.free(x)
    assert cached_tokens(mgr, "again", prompt) == 32


def test_hit_takes_page_out_of_lru_and_refreshes_it():
    mgr = KVCacheManager(8, BS)
    serve(mgr, "a", toks(33, 100))        # pages a0 a1
    serve(mgr, "b", toks(33, 500))        # pages b0 b1 (more recent)
    before = mgr.pool.cached_pages()
    assert len(before) == 4
    r = admit(mgr, "r", toks(17, 100))    # hits a0 only
    assert r.num_cached_tokens == 16
    a0 = r.pages[0]
    assert a0 == before[1]                # a's pages were freed tail first: a1, a0
    assert a0 not in mgr.pool.cached_pages()
    assert mgr.pool.state[a0] == PageState.PUBLISHED
    assert mgr.stats()["pages_cached"] == 3 and mgr.stats()["pages_live"] == 1
    mgr.free(r)
    # a0 is now the most recently used.
    assert mgr.pool.cached_pages() == [p for p in before if p != a0] + [a0]


# -- decode pages, reset, errors ------------------------------------------------------------

def test_decode_pages_publish_and_next_turn_hits_the_answer():
    mgr = KVCacheManager(32, BS)
    prompt = toks(20)
    pt = admit(mgr, "turn1", prompt)
    prefill(mgr, pt)
    answer = toks(30, 8000)
    published = []
    for t in answer:
        pt.token_ids.append(t)
        assert mgr.allocate(pt, 1)
        published.append(mgr.commit(pt, 1))
    # 50 tokens: pages 1 and 2 fill during decode (at tokens 32 and 48).
    assert sum(published) == 2
    assert published[32 - 20 - 1] == 1 and published[48 - 20 - 1] == 1
    mgr.free(pt)
    turn2 = prompt + answer + toks(5, 9000)
    assert cached_tokens(mgr, "turn2", turn2) == 48
    check_invariants(mgr)


def test_reset_drops_only_unreferenced_pages():
    mgr = KVCacheManager(16, BS)
    serve(mgr, "gone", toks(33, 100))                 # 2 cached-free pages
    running = serve(mgr, "running", toks(33, 500), keep=True)  # 2 published + 1 partial
    report = mgr.reset()
    assert (report.dropped_pages, report.kept_in_use_pages) == (2, 2)
    assert mgr.stats()["pages_cached"] == 0 and mgr.stats()["reset_dropped_pages"] == 2
    assert mgr.stats()["pages_free"] == 13 and mgr.stats()["pages_live"] == 3
    check_invariants(mgr)
    # The running request is unaffected and its pages still hit.
    assert [mgr.pool.state[p] for p in running.pages[:2]] == [PageState.PUBLISHED] * 2
    assert cached_tokens(mgr, "again", toks(33, 500)) == 32
    assert cached_tokens(mgr, "gone2", toks(33, 100)) == 0
    running.token_ids.append(1)
    assert mgr.allocate(running, 1)
    mgr.commit(running, 1)
    mgr.free(running)
    check_invariants(mgr)
    assert mgr.reset().dropped_pages == 4  # "again"'s pages were published too
    assert mgr.stats()["pages_free"] == 16


def test_new_page_table_duplicate_id_is_an_error():
    mgr = KVCacheManager(8, BS)
    pt = mgr.new_page_table("r", toks(5))
    with pytest.raises(ValueError, match="'r' already has a page table"):
        mgr.new_page_table("r", toks(5))
    mgr.free(pt)
    mgr.free(pt)  # idempotent
    mgr.new_page_table("r", toks(5))  # the id is free again


def test_allocate_and_commit_bounds():
    mgr = KVCacheManager(8, BS)
    pt = mgr.new_page_table("r", toks(20))
    with pytest.raises(ValueError, match="only 20 are known"):
        mgr.allocate(pt, 21)
    assert mgr.allocate(pt, 10)
    with pytest.raises(ValueError, match="past the allocated pages"):
        mgr.commit(pt, 17)
    one = KVCacheManager(1, BS)
    assert not one.allocate(one.new_page_table("s", toks(20)), 20)


def test_prompt_logprobs_request_reads_nothing_but_publishes():
    mgr = KVCacheManager(16, BS)
    serve(mgr, "warm", toks(40))
    assert cached_tokens(mgr, "logprobs", toks(40), read_cache=False) == 0
    assert cached_tokens(mgr, "reader", toks(40)) == 32
    mgr2 = KVCacheManager(16, BS)
    serve(mgr2, "logprobs", toks(40), read_cache=False)
    assert cached_tokens(mgr2, "reader", toks(40)) == 32


# -- multimodal pages -----------------------------------------------------------------------

def test_mm_hashes_change_only_overlapping_pages():
    mgr = KVCacheManager(32, BS)
    prompt = [5] * 40 + [1]
    # An image covering tokens [16, 24): page 1 only.
    serve(mgr, "img-a", prompt, mm_hashes=((16, 8, "A"),))
    assert cached_tokens(mgr, "img-b", prompt, mm_hashes=((16, 8, "B"),)) == 16
    assert cached_tokens(mgr, "img-a2", prompt, mm_hashes=((16, 8, "A"),)) == 32
    assert cached_tokens(mgr, "text", prompt) == 16
    # Same image, other placement inside page 1: page 1 differs.
    assert cached_tokens(mgr, "img-a-moved", prompt, mm_hashes=((18, 8, "A"),)) == 16


def test_mm_page_hashes_equal_plain_hashes_outside_images():
    mgr = KVCacheManager(8, BS)
    prompt = list(range(48))
    plain = mgr.new_page_table("plain", prompt)
    img = mgr.new_page_table("img", prompt, mm_hashes=((40, 4, b"\x01" * 16),))
    hp, hi = mgr.page_hashes(plain, 3), mgr.page_hashes(img, 3)
    assert hp[:2] == hi[:2] and hp[2] != hi[2]


# -- counters and gauges --------------------------------------------------------------------

def test_counters_and_gauges():
    mgr = KVCacheManager(16, BS)
    serve(mgr, "a", toks(40))
    serve(mgr, "b", toks(40))
    serve(mgr, "c", toks(20))
    s = mgr.stats()
    assert s["prefix_cache_queries"] == 100
    assert s["prefix_cache_hits"] == 32 + 16
    assert s["hit_rate"] == pytest.approx(0.48)
    assert s["published_pages"] == 2
    assert (s["pages_free"], s["pages_cached"], s["pages_live"]) == (14, 2, 0)
    assert s["pages_free"] + s["pages_cached"] + s["pages_live"] == s["pages_total"] == 16
    assert s["inflight_hits"] == 0 and s["evictions"] == 0


# -- regressions found while writing these tests --------------------------------------------

def _dup_then_evict(mgr: KVCacheManager, prompt: list[int]):
    """A and B compute the same cold prompt together; B's pages are private duplicates
    of A's. A finishes, and pressure evicts A's pages while B still runs."""
    a = admit(mgr, "A", prompt)
    b = admit(mgr, "B", prompt)
    assert mgr.allocate(a, len(prompt)) and mgr.allocate(b, len(prompt))
    mgr.commit(a, len(prompt))
    mgr.commit(b, len(prompt))
    assert mgr.counters.duplicate_pages == 3 and b.dup_positions == [0, 1, 2]
    mgr.free(a)
    c = serve(mgr, "C", toks(8 * 4, 7000))   # fills the pool: evicts A's pages
    assert mgr.counters.evictions == 3 and c.num_cached_tokens == 0
    return b


def test_orphan_never_displaces_a_reachable_entry():
    """B's chain runs through A's evicted pages, so B's next page is unreachable. It must
    not replace the reachable cached page D published for the same content."""
    mgr = KVCacheManager(12, 4)
    prompt = list(range(100, 113))     # 3 full pages + 1 token
    b = _dup_then_evict(mgr, prompt)
    nxt = prompt + [7, 7, 7] + [9]     # B's answer, then a new turn
    serve(mgr, "D", nxt)               # recomputes and publishes pages 0..3
    assert cached_tokens(mgr, "E1", nxt) == 16
    for t in (7, 7, 7):                # B fills page 3 with the same tokens
        b.token_ids.append(t)
        assert mgr.allocate(b, 1)
        assert mgr.commit(b, 1) == 0   # nothing publishable on a dead chain
    check_invariants(mgr)
    assert cached_tokens(mgr, "E2", nxt) == 16
    assert mgr.pool.state[b.pages[3]] == PageState.PENDING
    mgr.free(b)
    check_invariants(mgr)


def test_reachable_entry_supersedes_a_live_orphan():
    """B published page 3 while A's pages lived; then they were evicted, so B's page is
    an orphan held by B alone. D recomputes the same content: its reachable page takes
    the hash slot (B keeps its page, now private) and D's later pages publish too."""
    mgr = KVCacheManager(16, 4)
    prompt = list(range(100, 113))
    a = admit(mgr, "A", prompt)
    b = admit(mgr, "B", prompt)
    assert mgr.allocate(a, 13) and mgr.allocate(b, 13)
    mgr.commit(a, 13)
    mgr.commit(b, 13)
    for t in (7, 7, 7):
        b.token_ids.append(t)
        assert mgr.allocate(b, 1)
        mgr.commit(b, 1)
    orphan = b.pages[3]
    assert mgr.pool.state[orphan] == PageState.PUBLISHED
    mgr.free(a)
    serve(mgr, "C", toks(12 * 4, 7000))     # evicts A's 3 pages
    assert mgr.counters.evictions == 3
    nxt = prompt + [7, 7, 7] + [8, 8, 8, 8] + [9]
    d = serve(mgr, "D", nxt, keep=True)
    assert d.num_cached_tokens == 0
    assert [mgr.index.get(h) for h in d.hashes[:5]] == d.pages[:5]
    assert mgr.pool.state[orphan] == PageState.PENDING and orphan in b.pages
    check_invariants(mgr)
    mgr.free(d)
    assert cached_tokens(mgr, "E", nxt) == 20
    mgr.free(b)
    check_invariants(mgr)
    assert mgr.stats()["pages_live"] == 0


def test_dead_chain_takes_no_hits():
    """A table whose chain runs through an evicted page takes no further hits (only
    orphans could continue it)."""
    mgr = KVCacheManager(12, 4)
    prompt = list(range(100, 113))
    b = _dup_then_evict(mgr, prompt)
    assert mgr.peek_hits(b) == 0 and mgr.take_hits(b) == 0
    mgr.free(b)
    check_invariants(mgr)


def test_parent_of_follows_the_chain_and_rejects_unindexed_pages():
    mgr = KVCacheManager(8, 4)
    pt = serve(mgr, "A", toks(12), keep=True)
    first, second, third = pt.pages
    index = mgr.index
    assert isinstance(index.parent_of(first), bytes)  # page 0: the chain root's key
    assert index.parent_of(second) == index.entry_id[first]
    assert index.parent_of(third) == index.entry_id[second]
    assert index.reachable(index.parent_of(third))
    unused = next(p for p in range(8) if p not in pt.pages)
    with pytest.raises(KeyError, match=f"page {unused} holds no indexed key"):
        index.parent_of(unused)
    mgr.free(pt)
    check_invariants(mgr)
