"""Stateful property test of the cache core against an independent reference model.

Hypothesis drives random admit / follow / allocate (also under pressure) / commit /
fail / decode / finish / abort / preempt / re-admit / reset sequences over several
namespaces (tenants, a salt, an adapter) on a small pool, so pages are shared,
duplicated, evicted and re-published all the time.

The model knows nothing of hashes, entry ids or queues. It keeps:

- *entries*: one per published content, keyed by ``(namespace, token prefix up to the
  page end)`` (the hash is a function of exactly that), each with its parent entry
  object and its page. A lookup continues a chain only through the exact parent entry,
  so when a page is evicted every entry below it is unreachable (an orphan) until it is
  recomputed and published again below the new parent.
- *page_content*: the content whose KV was last written into each page by its owner.
  Every page a request takes as a hit must hold exactly the request's own prefix: this
  is the "never serve wrong KV" check, independent of any cache policy.
- the free set, the LRU list of cached-free pages (oldest first), holders per page,
  in-flight owners (followers poll them, nothing is queued for them) and counters.

After every step it checks the manager against the model: page tables, ref counts
(= number of page tables holding the page), states, LRU order, free + cached-free + live
== pool size, in-flight owners of every hashed page, counters (queries and hits summed from the
requests' ``num_cached_tokens`` at prefill completion), and the library's own
``check_invariants``. The teardown ends every request and checks nothing leaked.
"""
from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from prefixcache.cache import KVCacheManager, PageState
from prefixcache.cache.invariants import check_invariants

BS = 4
POOL = 8
MAX_LIVE = 3
MAX_LEN = 26

NAMESPACES = [
    {},
    {"tenant": "t1"},
    {"tenant": "t1", "cache_salt": "s"},
    {"extra_keys": ("adapter", "a", 1)},
]
_B0 = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 9, 9, 9, 9, 1, 1, 2, 2, 3, 3]
BASES = [_B0, _B0[:8] + [8, 7, 6, 5, 4, 3, 2, 1, 8, 8, 7, 7, 6, 6], [3, 1, 4, 1, 5, 9, 2, 6] * 3]
ROOT = "root"


class Entry:
    """A published content in the model; identity stands for the index's entry id."""

    __slots__ = ("content", "parent", "page", "alive")

    def __init__(self, content, parent, page):
        self.content, self.parent, self.page, self.alive = content, parent, page, True


class Req:
    def __init__(self, rid, ns, tokens, read_cache):
        self.rid, self.ns, self.tokens, self.read_cache = rid, ns, tokens, read_cache
        self.prompt_len = len(tokens)
        self.recorded = False
        self.start()

    def start(self):
        self.pt = None
        self.pages: list[int] = []
        self.kinds: list[str] = []           # "hit" or "own"
        self.chain: list = []                # Entry or None, per finalized page
        self.computed = self.scheduled = self.cached = self.inflight_hit = 0
        self.admitted = False

    def content(self, i):
        return (self.ns, tuple(self.tokens[:(i + 1) * BS]))


def reachable(e) -> bool:
    while e is not ROOT:
        if e is None or not e.alive:
            return False
        e = e.parent
    return True


class CacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.mgr = KVCacheManager(POOL, BS, model_id="m", root_seed="test", shuffle_seed=7)
        self.live: dict[str, Req] = {}
        self.preempted: dict[str, Req] = {}
        self.next_id = 0
        self.entries: dict[tuple, Entry] = {}
        self.page_entry: dict[int, Entry] = {}
        self.page_content: dict[int, tuple] = {}
        self.free = set(range(POOL))
        self.lru: list[int] = []
        self.holders: Counter[int] = Counter()
        self.inflight: dict[tuple, str] = {}
        self.evictions = 0
        self.queries = self.hits = self.inflight_hits = 0

    # -- model helpers -------------------------------------------------------------------
    def hit_limit(self, r: Req) -> int:
        return (len(r.tokens) - 1) // BS if r.read_cache and r.tokens else 0

    def expected_hits(self, r: Req) -> list[Entry]:
        i = len(r.pages)
        if i >= self.hit_limit(r) or r.computed != i * BS or len(r.chain) != i:
            return []
        parent = ROOT if i == 0 else r.chain[i - 1]
        if not reachable(parent):
            return []
        out = []
        while i < self.hit_limit(r):
            e = self.entries.get(r.content(i))
            if e is None or e.parent is not parent:
                break
            out.append(e)
            parent, i = e, i + 1
        return out

    def next_owner(self, r: Req, ahead: int = 0):
        i = len(r.pages)
        if i + ahead >= self.hit_limit(r) or r.computed != i * BS or len(r.chain) != i:
            return None
        owner = self.inflight.get(r.content(i + ahead))
        return None if owner == r.rid else owner

    def remove_entry(self, e: Entry):
        assert self.entries.pop(e.content) is e
        del self.page_entry[e.page]
        e.alive = False

    def withdraw_all(self, rid):
        for c in [c for c, o in self.inflight.items() if o == rid]:
            del self.inflight[c]

    def pick(self, n, pred):
        cands = sorted((r for r in self.live.values() if pred(r)), key=lambda r: r.rid)
        return cands[n % len(cands)] if cands else None

    def take(self, r: Req):
        want = self.expected_hits(r)
        first = not r.admitted
        got = self.mgr.take_hits(r.pt)
        r.admitted = True
        assert got == len(want) * BS
        assert r.pt.pages[len(r.pages):] == [e.page for e in want]
        for e in want:
            i = len(r.pages)
            # A hit holds exactly this request's prefix: never wrong KV.
            assert self.page_content[e.page] == r.content(i) == e.content
            if self.holders[e.page] == 0:
                self.lru.remove(e.page)
            self.holders[e.page] += 1
            r.pages.append(e.page)
            r.kinds.append("hit")
            r.chain.append(e)
        r.computed += got
        r.cached += got
        if not first:
            r.inflight_hit += got
        assert r.cached <= len(r.tokens) - 1 or r.cached == 0

    def maybe_record(self, r: Req):
        if not r.recorded and r.computed >= r.prompt_len:
            r.recorded = True
            self.mgr.record_query(r.prompt_len, r.pt.num_cached_tokens,
                                  r.pt.num_inflight_hit_tokens)
            self.queries += r.prompt_len
            self.hits += r.cached
            self.inflight_hits += r.inflight_hit
            assert r.cached <= r.prompt_len - 1 or r.cached == 0

    def release_pages(self, r: Req):
        for p in reversed(r.pages):
            self.holders[p] -= 1
            if self.holders[p] == 0:
                del self.holders[p]
                if p in self.page_entry:
                    self.lru.append(p)
                else:
                    self.free.add(p)

    # -- eviction policy (hooks: the pin and quota machine below overrides them) ---------
    def next_victim(self, r: Req) -> int:
        """The page an allocation for ``r`` evicts: the least recently used one."""
        return self.lru[0]

    def claimed(self, page: int, r: Req) -> None:
        """``page`` was allocated to ``r`` (from the free queue or by eviction)."""

    def evicted(self, page: int) -> None:
        """``page``'s entry was evicted (after it left the model's LRU list)."""

    def cached_order(self) -> list[int]:
        """``pool.cached_pages()`` as the model expects it."""
        return self.lru

    # -- rules ---------------------------------------------------------------------------
    # -- preconditions ---------------------------------------------------------------------
    def _room(self):
        return len(self.live) < MAX_LIVE

    def _idle(self):
        return any(r.scheduled == 0 for r in self.live.values())

    def _schedulable(self):
        return any(r.scheduled == 0 and r.computed < len(r.tokens) for r in self.live.values())

    def _scheduled(self):
        return any(r.scheduled > 0 for r in self.live.values())

    def _decodable(self):
        return any(r.scheduled == 0 and r.computed == len(r.tokens) and len(r.tokens) < MAX_LEN
                   for r in self.live.values())

    # Namespace 0, base 0 and "no mutation" are drawn more often, so prompts share.
    @precondition(_room)
    @rule(ns=st.sampled_from([0, 0, 0, 1, 2, 3]), base=st.sampled_from([0, 0, 1, 2]),
          length=st.integers(1, 22), mutate=st.sampled_from([-1] * 6 + list(range(22))),
          read_cache=st.sampled_from([True, True, True, True, False]),
          follow=st.booleans())
    def admit(self, ns, base, length, mutate, read_cache, follow):
        tokens = list(BASES[base][:length])
        if 0 <= mutate < length:
            tokens[mutate] = 42
        r = Req(f"r{self.next_id}", ns, tokens, read_cache)
        self.next_id += 1
        r.pt = self.mgr.new_page_table(r.rid, r.tokens, read_cache=read_cache,
                                       **NAMESPACES[ns])
        self.live[r.rid] = r
        self.take(r)
        if follow:
            self._wait(r)

    @precondition(lambda self: self._room() and self.live)
    @rule(n=st.integers(0, 99), extra=st.sampled_from([0, 0, 1, 5]), follow=st.booleans())
    def clone(self, n, extra, follow):
        """A second request with a live request's prompt (plus a few tokens): it hits,
        follows the first, or computes a duplicate of its pages."""
        src = self.pick(n, lambda r: True)
        tokens = list(src.tokens[:src.prompt_len]) + [9] * extra
        r = Req(f"r{self.next_id}", src.ns, tokens, src.read_cache)
        self.next_id += 1
        r.pt = self.mgr.new_page_table(r.rid, r.tokens, read_cache=r.read_cache,
                                       **NAMESPACES[r.ns])
        self.live[r.rid] = r
        self.take(r)
        if follow:
            self._wait(r)

    @precondition(lambda self: self._room() and self.preempted)
    @rule(n=st.integers(0, 99))
    def readmit_preempted(self, n):
        rid = sorted(self.preempted)[n % len(self.preempted)]
        r = self.preempted.pop(rid)
        r.start()
        r.pt = self.mgr.new_page_table(r.rid, r.tokens, read_cache=r.read_cache,
                                       **NAMESPACES[r.ns])
        self.live[rid] = r
        self.take(r)

    def _wait(self, r: Req):
        owner = self.next_owner(r)
        ok = self.mgr.wait(r.pt)
        assert ok == (owner is not None)
        assert self.mgr.next_page_owner(r.pt) == owner

    @precondition(_idle)
    @rule(n=st.integers(0, 99))
    def follow(self, n):
        r = self.pick(n, lambda r: r.scheduled == 0)
        if r is not None:
            self._wait(r)

    @precondition(_idle)
    @rule(n=st.integers(0, 99))
    def retake_hits(self, n):
        """As a polling follower does: take whatever was published meanwhile."""
        r = self.pick(n, lambda r: r.scheduled == 0)
        if r is not None:
            self.take(r)
            self.maybe_record(r)

    @precondition(_schedulable)
    @rule(n=st.integers(0, 99), chunk=st.integers(1, 12))
    def allocate(self, n, chunk):
        self._allocate(n, chunk)

    @precondition(_schedulable)
    @rule(n=st.integers(0, 99), chunk=st.sampled_from([1, 3, 4, 8, 26]))
    def step(self, n, chunk):
        """A whole model step: allocate, then commit at once (the common case)."""
        r = self._allocate(n, chunk)
        if r is not None and r.scheduled:
            self._commit(r)

    def _allocate(self, n, chunk):
        r = self.pick(n, lambda r: r.scheduled == 0 and r.computed < len(r.tokens))
        k = min(chunk, len(r.tokens) - r.computed)
        end = r.computed + k
        need = max(0, -(-end // BS) - len(r.pages))
        avail = len(self.free) + len(self.lru)
        ok = self.mgr.allocate(r.pt, k)
        assert ok == (need <= avail)
        if not ok:   # allocation under pressure refused: nothing changed
            assert r.pt.pages == r.pages
            return r
        new = r.pt.pages[len(r.pages):]
        assert len(new) == need
        n_free = min(need, len(self.free))
        assert set(new[:n_free]) <= self.free
        for p in new[:n_free]:
            self.free.remove(p)
            self.claimed(p, r)
        for p in new[n_free:]:   # evicted one by one, in the model's eviction order
            assert p == self.next_victim(r)
            self.lru.remove(p)
            self.remove_entry(self.page_entry[p])
            self.evictions += 1
            self.claimed(p, r)
            self.evicted(p)
        for p in new:
            self.holders[p] = 1
            r.pages.append(p)
            r.kinds.append("own")
        if not r.chain or r.chain[-1] is not None:
            first = max(r.computed // BS, len(r.chain))
            last = min(-(-end // BS), len(r.tokens) // BS)
            for i in range(first, last):
                c = r.content(i)
                if c not in self.entries and c not in self.inflight:
                    self.inflight[c] = r.rid
        r.scheduled = k
        return r

    @precondition(_scheduled)
    @rule(n=st.integers(0, 99))
    def commit(self, n):
        self._commit(self.pick(n, lambda r: r.scheduled > 0))

    def _commit(self, r: Req):
        published = self.mgr.commit(r.pt, r.scheduled)
        r.computed += r.scheduled
        r.scheduled = 0
        want_published = 0
        for i in range(len(r.chain), r.computed // BS):
            c, page = r.content(i), r.pages[i]
            assert r.kinds[i] == "own"
            self.page_content[page] = c
            parent = ROOT if i == 0 else r.chain[i - 1]
            ref = None
            if reachable(parent):
                e = self.entries.get(c)
                if e is not None and e.parent is parent:
                    ref = e                                  # identical page exists
                else:
                    if e is not None:
                        assert not reachable(e.parent)       # no true collisions here
                        if self.holders[e.page] == 0:        # stale, cached-free
                            self.remove_entry(e)
                            self.lru.remove(e.page)
                            self.free.add(e.page)
                            e = None
                        elif self.holders[e.page] == 1:      # live orphan: made private
                            self.remove_entry(e)
                            e = None
                    if e is None:
                        ref = Entry(c, parent, page)
                        self.entries[c] = ref
                        self.page_entry[page] = ref
                        want_published += 1
            r.chain.append(ref)
            if ref is not None or self.inflight.get(c) == r.rid:
                self.inflight.pop(c, None)   # readable now, or taken over by followers
        assert published == want_published
        self.maybe_record(r)

    @precondition(_scheduled)
    @rule(n=st.integers(0, 99))
    def fail_step(self, n):
        r = self.pick(n, lambda r: r.scheduled > 0)
        self.mgr.fail_step(r.pt)
        r.scheduled = 0
        self.withdraw_all(r.rid)

    @precondition(_decodable)
    @rule(n=st.integers(0, 99), token=st.sampled_from([1, 2, 9]))
    def decode_token(self, n, token):
        r = self.pick(n, lambda r: r.scheduled == 0 and r.computed == len(r.tokens)
                      and len(r.tokens) < MAX_LEN)
        r.tokens.append(token)   # the manager reads the same list

    @precondition(lambda self: self.live)
    @rule(n=st.integers(0, 99), how=st.sampled_from(["finish", "finish", "abort", "preempt"]))
    def end(self, n, how):
        r = self.pick(n, lambda r: True)
        if how == "finish" and r.computed < len(r.tokens):
            how = "abort"
        self.mgr.free(r.pt)
        self.withdraw_all(r.rid)
        self.release_pages(r)
        del self.live[r.rid]
        self.mgr.free(r.pt)   # idempotent
        if how == "preempt":
            self.preempted[r.rid] = r

    @rule(roll=st.integers(0, 7))
    def reset(self, roll):
        if roll:   # make resets rare, so the cache fills up and evicts
            return
        report = self.mgr.reset()
        assert report.dropped_pages == len(self.lru)
        for p in self.lru:
            self.remove_entry(self.page_entry[p])
            self.free.add(p)
        self.lru = []
        assert report.kept_in_use_pages == len(self.page_entry)

    # -- checks --------------------------------------------------------------------------
    @invariant()
    def library_invariants_hold(self):
        check_invariants(self.mgr)

    @invariant()
    def matches_model(self):
        mgr, pool = self.mgr, self.mgr.pool
        assert set(mgr.tables) == set(self.live)
        for r in self.live.values():
            pt = r.pt
            assert mgr.tables[r.rid] is pt
            assert pt.pages == r.pages
            assert pt.num_computed_tokens == r.computed
            assert pt.num_cached_tokens == r.cached
            assert pt.num_inflight_hit_tokens == r.inflight_hit
            assert len(pt.chain_refs) == len(r.chain)
            for i, (page, kind) in enumerate(zip(r.pages, r.kinds)):
                if kind == "hit":
                    # Never an unpublished page of another request, never wrong KV.
                    assert pool.state[page] == PageState.PUBLISHED
                    assert self.page_content[page] == r.content(i)
                else:
                    assert pool.state[page] in (PageState.PENDING, PageState.PUBLISHED)
            for i, h in enumerate(pt.hashes):   # who computes each page it hashed
                assert mgr.inflight.owner(h) == self.inflight.get(r.content(i))
            assert mgr.next_page_owner(pt) == self.next_owner(r)
            # The memoised probe agrees with the model after every operation.
            want = [e.page for e in self.expected_hits(r)]
            probe = mgr.probe(pt)
            assert list(probe.hit_pages) == want == mgr.match_pages(pt)
            assert probe.num_cached_free == sum(1 for p in want if self.holders[p] == 0)
            assert probe.next_owner == self.next_owner(r, len(want))
        # ref_count == number of page tables holding the page; states; queues.
        tables_holding = Counter(p for r in self.live.values() for p in r.pages)
        assert tables_holding == self.holders
        for p in range(POOL):
            assert pool.ref_count[p] == self.holders[p]
            published = p in self.page_entry
            held = self.holders[p] > 0
            want = {(True, True): PageState.PUBLISHED, (True, False): PageState.CACHED_FREE,
                    (False, True): PageState.PENDING, (False, False): PageState.FREE}
            assert pool.state[p] == want[published, held], p
        assert pool.cached_pages() == self.cached_order()
        assert set(pool.free_pages()) == self.free
        live = sum(1 for p in range(POOL) if self.holders[p] > 0)
        assert (pool.num_free, pool.num_cached, pool.num_live) == (
            len(self.free), len(self.lru), live)
        assert len(self.free) + len(self.lru) + live == POOL
        assert len(mgr.index) == len(self.entries)
        assert len(mgr.inflight) == len(self.inflight)
        assert set(self.inflight.values()) <= set(self.live)
        s = mgr.stats()
        assert (s["prefix_cache_queries"], s["prefix_cache_hits"], s["inflight_hits"]) == (
            self.queries, self.hits, self.inflight_hits)
        assert s["evictions"] == self.evictions
        assert s["pages_free"] + s["pages_cached"] + s["pages_live"] == POOL

    def teardown(self):
        for r in list(self.live.values()):
            self.mgr.free(r.pt)
        check_invariants(self.mgr)
        pool = self.mgr.pool
        assert pool.num_live == 0 and len(self.mgr.inflight) == 0 and not self.mgr.tables
        assert all(pool.ref_count[p] == 0 for p in range(POOL))
        assert pool.num_free + pool.num_cached == POOL
        self.mgr.reset()
        assert pool.num_free == POOL and len(self.mgr.index) == 0


CacheMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PREFIXCACHE_STATEFUL_EXAMPLES", "120")),
    stateful_step_count=80,
    deadline=None,
    derandomize=os.environ.get("CI", "").lower() == "true",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCacheStateful = CacheMachine.TestCase
