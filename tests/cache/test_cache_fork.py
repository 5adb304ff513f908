"""KVCacheManager.fork: a parallel sample's table shares the parent's published full
pages and gets private pages for the rest, checked against the page invariants."""
from __future__ import annotations

import pytest

from prefixcache.cache import KVCacheManager
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.page_pool import PageState
from tests.cache.cache_helpers import admit, prefill

BS = 4
TOKENS = list(range(1, 11))  # 2 full pages + 2 tokens


def parent_and_child(mgr: KVCacheManager, **ns):
    parent = admit(mgr, "p", TOKENS, **ns)
    prefill(mgr, parent)
    child = mgr.new_page_table("c", list(TOKENS), **ns)
    return parent, child


def test_fork_shares_full_pages_and_copies_the_partial_one():
    mgr = KVCacheManager(16, BS)
    parent, child = parent_and_child(mgr)
    copies = mgr.fork(parent, child)
    check_invariants(mgr)
    assert child.pages[:2] == parent.pages[:2]
    assert copies == [(parent.pages[2], child.pages[2])]
    assert child.pages[2] != parent.pages[2]
    assert [mgr.pool.ref_count[p] for p in child.pages] == [2, 2, 1]
    assert mgr.pool.state[child.pages[2]] == PageState.PENDING
    assert child.num_computed_tokens == 10 and child.num_cached_tokens == 0
    assert mgr.counters.fork_shared_pages == 2 and mgr.counters.fork_copied_pages == 1
    # both decode on: each writes only its own partial page, then publishes it
    for pt, tok in ((parent, 50), (child, 60)):
        pt.token_ids.extend([tok, tok + 1])
        assert mgr.allocate(pt, 2)
        mgr.commit(pt, 2)
        check_invariants(mgr)
    assert mgr.pool.state[child.pages[2]] == PageState.PUBLISHED
    assert mgr.pool.state[parent.pages[2]] == PageState.PUBLISHED
    mgr.free(parent)
    check_invariants(mgr)
    assert [mgr.pool.ref_count[p] for p in child.pages] == [1, 1, 1]
    mgr.free(child)
    check_invariants(mgr)
    assert mgr.pool.num_live == 0


def test_fork_with_caching_off_copies_every_page():
    mgr = KVCacheManager(16, BS, enable_prefix_caching=False)
    parent, child = parent_and_child(mgr)
    copies = mgr.fork(parent, child)
    check_invariants(mgr)
    assert [a for a, _ in copies] == parent.pages and [b for _, b in copies] == child.pages
    assert not set(parent.pages) & set(child.pages)


def test_fork_without_pages_changes_nothing():
    mgr = KVCacheManager(3, BS)
    parent, child = parent_and_child(mgr)
    assert mgr.fork(parent, child) is None
    check_invariants(mgr)
    assert child.pages == [] and child.num_computed_tokens == 0
    assert [mgr.pool.ref_count[p] for p in parent.pages] == [1, 1, 1]


def test_fork_evicts_a_cached_page_for_the_copy():
    mgr = KVCacheManager(4, BS)
    other = admit(mgr, "o", [90, 91, 92, 93, 94])
    prefill(mgr, other)
    mgr.free(other)  # 1 cached-free page, 1 free
    parent, child = parent_and_child(mgr)
    assert mgr.pool.num_free == 0 and mgr.pool.num_cached == 1
    assert mgr.fork(parent, child) is not None
    check_invariants(mgr)
    assert mgr.counters.evictions == 1


@pytest.mark.parametrize("case", ["not empty", "other tenant", "other tokens"])
def test_fork_refuses_a_table_that_does_not_continue_the_parent(case):
    mgr = KVCacheManager(16, BS)
    parent = admit(mgr, "p", TOKENS)
    prefill(mgr, parent)
    if case == "not empty":
        child = admit(mgr, "c", TOKENS)
        assert mgr.allocate(child, 2)
    elif case == "other tenant":
        child = mgr.new_page_table("c", list(TOKENS), tenant="t2")
    else:
        child = mgr.new_page_table("c", TOKENS[:-1] + [99])
    with pytest.raises(ValueError, match="fork into 'c'"):
        mgr.fork(parent, child)
