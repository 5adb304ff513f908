"""Checks of DESIGN.md's page invariants over a whole :class:`KVCacheManager`.

Used by the property-based tests after every operation, and by the engine in debug mode
(``PREFIXCACHE_CHECK_INVARIANTS=1``). O(pool size + total page-table length).
"""
from __future__ import annotations

from collections import Counter

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_pool import PageState


class InvariantError(AssertionError):
    """A page invariant does not hold."""


def check_invariants(mgr: KVCacheManager) -> None:
    """Raise :class:`InvariantError` naming the first broken invariant."""
    pool, index, bs = mgr.pool, mgr.index, mgr.block_size
    holders: Counter[int] = Counter()
    for rid, pt in mgr.tables.items():
        if pt.request_id != rid:
            raise InvariantError(f"table keyed {rid!r} belongs to {pt.request_id!r}")
        if len(set(pt.pages)) != len(pt.pages):
            raise InvariantError(f"{rid}: a page appears twice in one page table")
        holders.update(pt.pages)
        # Different namespaces never share a page: every page a table holds was taken by
        # its tenant (quotas and usage count pages by that owner).
        for page in pt.pages:
            if pool.owner[page] != pt.tenant:
                raise InvariantError(f"{rid}: page {page} belongs to tenant "
                                     f"{pool.owner[page]!r}, the table to {pt.tenant!r}")
        if pt.num_computed_tokens > len(pt.pages) * bs:
            raise InvariantError(f"{rid}: computed tokens beyond its pages")
        if len(pt.chain_refs) > pt.num_computed_tokens // bs:
            raise InvariantError(f"{rid}: a page was finalized before its KV was complete")
        if pt.num_cached_tokens > max(0, len(pt.token_ids) - 1):
            raise InvariantError(f"{rid}: cached tokens cover the last token")
        # Pages whose KV is not complete must be private: never write a shared page.
        for page in pt.pages[pt.num_computed_tokens // bs:]:
            if pool.state[page] != PageState.PENDING or pool.ref_count[page] != 1:
                raise InvariantError(f"{rid}: page {page} is written but not private "
                                     f"({pool.state[page].name}, ref {pool.ref_count[page]})")
        # Pages read as hits must be published (or our own, computed earlier).
        for page in pt.pages[:len(pt.chain_refs)]:
            if pool.state[page] not in (PageState.PUBLISHED, PageState.PENDING):
                raise InvariantError(f"{rid}: holds page {page} in state {pool.state[page].name}")
            if pool.state[page] == PageState.PENDING and pool.ref_count[page] != 1:
                raise InvariantError(f"{rid}: unpublished page {page} is shared")
    free_set = set(pool.free_pages())
    cached_set = set(pool.cached_pages())
    indexed = set(index.indexed_pages())
    live = 0
    for page in range(pool.num_pages):
        st, ref = pool.state[page], pool.ref_count[page]
        if ref != holders[page]:
            raise InvariantError(f"page {page}: ref_count {ref} != {holders[page]} holders")
        if ref > 0:
            live += 1
        expect_ref = {PageState.FREE: ref == 0, PageState.CACHED_FREE: ref == 0,
                      PageState.PENDING: ref > 0, PageState.PUBLISHED: ref > 0}[st]
        if not expect_ref:
            raise InvariantError(f"page {page}: state {st.name} with ref_count {ref}")
        if (page in free_set) != (st == PageState.FREE):
            raise InvariantError(f"page {page}: free queue disagrees with state {st.name}")
        if (page in cached_set) != (st == PageState.CACHED_FREE):
            raise InvariantError(f"page {page}: LRU queue disagrees with state {st.name}")
        if (page in indexed) != (st in (PageState.PUBLISHED, PageState.CACHED_FREE)):
            raise InvariantError(f"page {page}: index disagrees with state {st.name}")
        page_hash = index.page_hash[page]
        if page in indexed and (page_hash is None or index.get(page_hash) != page):
            raise InvariantError(f"page {page}: index entry does not point back")
    if live != pool.num_live:
        raise InvariantError(f"live gauge {pool.num_live} != {live}")
    if pool.num_free + pool.num_cached + pool.num_live != pool.num_pages:
        raise InvariantError("free + cached-free + live != pool size")
    check_pins_and_owners(mgr)
    for h in mgr.inflight:
        owner = mgr.inflight.owner(h)
        if owner not in mgr.tables:
            raise InvariantError(f"in-flight page owned by a request with no page table: {owner}")
        if h in index:
            raise InvariantError("a hash is both published and in flight")


def check_pins_and_owners(mgr: KVCacheManager) -> None:
    """Pins (:mod:`.pins`): every pinned page is indexed, pin counts and flags agree with
    the pins, the cap holds, and cached-free pages wait in the queue of their class.
    Owners: usage per tenant equals its non-free pages."""
    pool, index, reg = mgr.pool, mgr.index, mgr.pins
    counts: Counter[int] = Counter(p for pin in reg.pins.values() for p in set(pin.pages)
                                   if p is not None)
    for pin in reg.pins.values():
        for h in pin.demoted():
            if pin.key not in reg.demotion.waiting.get(h, ()):
                raise InvariantError("a demoted pin page is not awaited by its hash")
    awaited = sum(map(len, reg.demotion.waiting.values()))
    if awaited != sum(len(p.demoted()) for p in reg.pins.values()):
        raise InvariantError("pins await hashes they do not hold")
    for page in range(pool.num_pages):
        if reg.pin_count[page] != counts[page]:
            raise InvariantError(f"page {page}: pin count {reg.pin_count[page]} != "
                                 f"{counts[page]} pins")
        if pool.pinned[page] != (counts[page] > 0):
            raise InvariantError(f"page {page}: pinned flag disagrees with its pins")
        if counts[page] and index.page_hash[page] is None:
            raise InvariantError(f"page {page} is pinned but not published")
    if len(counts) != reg.num_pinned_pages or len(counts) > reg.cap_pages:
        raise InvariantError(f"{len(counts)} pinned pages (gauge {reg.num_pinned_pages}, "
                             f"cap {reg.cap_pages})")
    queued, n_unpinned = pool.cached_pages(), pool.queues.count(False)
    if any(pool.pinned[p] != (i >= n_unpinned) for i, p in enumerate(queued)):
        raise InvariantError("a cached-free page waits in the wrong (pinned) queue")
    usage: Counter = Counter(pool.owner[p] for p in range(pool.num_pages)
                             if pool.state[p] != PageState.FREE)
    if usage != pool.usage:
        raise InvariantError(f"tenant usage {dict(pool.usage)} != owned pages {dict(usage)}")
