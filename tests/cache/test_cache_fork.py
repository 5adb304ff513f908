"""KVCacheManager.fork: a parallel sample's table shares the parent's published full
pages and gets private pages for the rest, checked against the page invariants."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

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
    assert child.hashes == parent.hashes[:2]  # the shared chain, not hashed again
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


class ForkMachine(RuleBasedStateMachine):
    """Prefill, fork, decode (tokens from a small alphabet, so forked samples often write
    identical pages: duplicates), preempt and finish in any order over a small pool; the
    page invariants hold after every operation and nothing is held at the end."""

    def __init__(self):
        super().__init__()
        self.mgr = KVCacheManager(10, BS)
        self.live: list = []
        self.count = 0

    def _new(self, tokens):
        self.count += 1
        return self.mgr.new_page_table(f"r{self.count}", list(tokens))

    def _pick(self, i):
        return self.live[i % len(self.live)]

    @rule(length=st.integers(1, 13), prefix=st.sampled_from([0, 0, 1]))
    def prefill(self, length, prefix):
        pt = self._new([prefix * 50 + i for i in range(length)])
        self.mgr.take_hits(pt)
        n = len(pt.token_ids) - pt.num_computed_tokens
        if not self.mgr.allocate(pt, n):
            self.mgr.free(pt)
            return
        self.mgr.commit(pt, n)
        self.live.append(pt)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def fork(self, i):
        parent = self._pick(i)
        child = self._new(parent.token_ids[:parent.num_computed_tokens])
        shared_before = [self.mgr.pool.ref_count[p] for p in parent.pages]
        copies = self.mgr.fork(parent, child)
        if copies is None:
            assert child.pages == []
            self.mgr.free(child)
            return
        full = parent.num_computed_tokens // BS
        for j, page in enumerate(child.pages):
            if page == parent.pages[j]:  # shared: a published full page, one more holder
                assert j < full and self.mgr.pool.state[page] == PageState.PUBLISHED
                assert self.mgr.pool.ref_count[page] == shared_before[j] + 1
            else:
                assert (parent.pages[j], page) in copies
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99), tok=st.integers(0, 2))
    def decode(self, i, tok):
        pt = self._pick(i)
        if len(pt.token_ids) >= 40:
            return
        pt.token_ids.append(tok)
        if self.mgr.allocate(pt, 1):
            self.mgr.commit(pt, 1)
        else:  # preempted: its pages go, its published ones stay cached
            self.mgr.free(pt)
            self.live.remove(pt)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 99))
    def finish(self, i):
        pt = self._pick(i)
        self.mgr.free(pt)
        self.live.remove(pt)

    @invariant()
    def invariants_hold(self):
        check_invariants(self.mgr)

    def teardown(self):
        for pt in self.live:
            self.mgr.free(pt)
        check_invariants(self.mgr)
        assert self.mgr.pool.num_live == 0


ForkMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
TestForkStateful = ForkMachine.TestCase
