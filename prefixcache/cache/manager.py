"""The KV cache manager: the facade the engine calls around each model step.

It ties together the page pool, page keys and hashes, the prefix index, the in-flight
registry, hits (:mod:`.hits`), allocation (:mod:`.allocation`) and publication
(:mod:`.publish`):

1. :meth:`~KVCacheManager.new_page_table` when a request is admitted (or re-admitted),
2. :meth:`~KVCacheManager.take_hits` to read the longest published prefix; a follower
   polls it and :meth:`~KVCacheManager.next_page_owner` each step while a leader
   computes its next page,
3. :meth:`~KVCacheManager.allocate` before a step that writes new tokens,
4. :meth:`~KVCacheManager.commit` after the step completed without error (publishes the
   full pages), or :meth:`~KVCacheManager.fail_step` if it failed,
5. :meth:`~KVCacheManager.free` on finish, abort or preemption.

Pins (:mod:`.pins`, ``mgr.pins``) keep a prefix's pages for a TTL (evicted last, capped);
tenant quotas (:mod:`.quotas`, ``mgr.quotas``) choose which pages an allocation evicts.
What lies beyond the pool (KV tiers, a shared store) is one connector
(:mod:`.connector`, ``mgr.connector``), given at construction.

Policy (DESIGN.md): only full pages are shared; a hit never covers the last token
(whole-page reuse, so a 32-token prompt sent twice reuses 16); decode pages publish too.
Nothing here grows with the number of requests served: every container is bounded by
the pool size and the live page tables.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from prefixcache.cache.allocation import Allocator
from prefixcache.cache.connector import KVConnector, NullConnector
from prefixcache.cache.events import CacheEventLog
from prefixcache.cache.hashing import HashFn, PageHasher
from prefixcache.cache.hits import HitFinder, Probe
from prefixcache.cache.inflight import InflightRegistry
from prefixcache.cache.miss_diagnosis import DropLog
from prefixcache.cache.page_keys import PageKeys
from prefixcache.cache.page_pool import PagePool, PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.pins import Pin, PinRegistry
from prefixcache.cache.prefix_index import PrefixIndex
from prefixcache.cache.publish import Publisher
from prefixcache.cache.quotas import TenantQuotas
from prefixcache.cache.stats import CacheCounters, snapshot


@dataclass
class ResetReport:
    """What :meth:`KVCacheManager.reset` did, in pages."""

    dropped_pages: int
    kept_in_use_pages: int


class KVCacheManager:
    """Manages a pool of ``num_pages`` KV pages of ``block_size`` tokens.

    Args:
        num_pages: pool size in pages.
        block_size: tokens per page (default 16).
        enable_prefix_caching: if ``False`` nothing is indexed, hit or followed.
        model_id: part of every hash chain root.
        root_seed: hash root seed, ``None`` for the default (see :mod:`.hashing`).
        hash_fn: override the page hash function (tests force collisions with it).
        shuffle_seed: start the free queue in random order (non-contiguous pages).
        max_pinned_fraction: cap on pinned pages, a share of the pool (:mod:`.pins`).
        tenant_quota_fraction: every tenant's quota, a share of the pool; ``None`` for
            none (:mod:`.quotas`). ``tenant_quotas``: per-tenant shares overriding it.
        clock: time source of pin TTLs, in seconds (default ``time.time``).
        connector: what lies beyond the pool (:mod:`.connector`), bound to this manager
            here; default :class:`~.connector.NullConnector` (nothing). With
            ``connector.writes_back``, evicted pages are handed to it and pinned pages
            are demoted with their pins rather than lapsing them.

    Raises:
        ValueError: ``block_size < 1``, ``num_pages < 1``, or a fraction out of range;
            ``connector`` already bound to another manager.
    """

    def __init__(self, num_pages: int, block_size: int = 16, *,
                 enable_prefix_caching: bool = True, model_id: str = "",
                 root_seed: bytes | str | None = None, hash_fn: HashFn | None = None,
                 shuffle_seed: int | None = None, max_pinned_fraction: float = 0.5,
                 tenant_quota_fraction: float | None = None,
                 tenant_quotas: dict | None = None,
                 clock: Callable[[], float] = time.time,
                 connector: KVConnector | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.pool = PagePool(num_pages, shuffle_seed=shuffle_seed)
        self.index = PrefixIndex(num_pages)
        self.inflight = InflightRegistry()
        self.hasher = PageHasher(model_id, root_seed, hash_fn)
        self.keys = PageKeys(self.hasher, block_size)
        self.counters = CacheCounters()
        self.tables: dict[str, PageTable] = {}
        self._publisher = Publisher(self.pool, self.index, self.inflight, self.keys,
                                    self.counters, self.drop_cached, enable_prefix_caching)
        self._hits = HitFinder(self.pool, self.index, self.inflight, self.keys,
                               enable_prefix_caching)
        self.pins = PinRegistry(self.pool, max_pinned_fraction, clock)
        self.quotas = TenantQuotas(num_pages, tenant_quota_fraction, tenant_quotas)
        self._alloc = Allocator(self.pool, self.index, self.inflight, self.keys,
                                self.counters, self._evict, enable_prefix_caching,
                                self._victim)
        self.drop_log: DropLog | None = None  # see :meth:`record_drops`
        self._quota_victim: int | None = None
        self.connector = connector if connector is not None else NullConnector()
        self.connector.bind(self)
        if self.connector.writes_back:  # evicted pages go down to the tiers, pins too
            self._alloc.on_evict = self.connector.on_evict
            self.pins.demotion.enabled = True
            self.pins.demotion.hook = self.connector.on_pinned

    @property
    def enable_prefix_caching(self) -> bool:
        return self._hits.enabled

    # -- page tables -------------------------------------------------------------------
    def new_page_table(self, request_id: str, token_ids: list[int], *,
                       tenant: str | None = None, cache_salt: str | None = None,
                       extra_keys: tuple = (), mm_hashes: tuple = (),
                       read_cache: bool = True) -> PageTable:
        """Create (and track) an empty page table for a request.

        Args:
            token_ids: the request's token list; it may grow (decode) but never shrink.
            tenant, cache_salt: the namespace; different namespaces never share a page.
            extra_keys: e.g. ``("adapter", adapter_id, version)``; part of every page key.
            mm_hashes: ``(offset, length, content_hash)`` per multimodal input, in tokens.
            read_cache: ``False`` to compute every position (still publishes).

        Raises:
            ValueError: ``request_id`` already has a live page table.
        """
        if request_id in self.tables:
            raise ValueError(f"request_id {request_id!r} already has a page table")
        pt = self.keys.new_table(request_id, token_ids, tenant, cache_salt, extra_keys,
                                 mm_hashes, read_cache)
        self.tables[request_id] = pt
        return pt

    def hit_limit_pages(self, pt: PageTable) -> int:
        """Most leading pages a table may read from the cache: the last token is always
        computed, so ``(len(token_ids) - 1) // block_size``."""
        return self._hits.limit(pt)

    def page_hashes(self, pt: PageTable, num_pages: int) -> list[bytes]:
        """Hashes of (at least) the first ``num_pages`` full pages, computed once.

        Raises:
            ValueError: the tokens of those pages are not known yet.
        """
        return self.keys.hashes(pt, num_pages)

    # -- hits and following ------------------------------------------------------------
    def match_pages(self, pt: PageTable) -> list[int]:
        """Published pages that continue the table, in order (no side effects; see
        :mod:`.hits`). Empty unless the table ends on a page boundary."""
        return list(self._hits.match(pt))

    def probe(self, pt: PageTable) -> Probe:
        """:class:`~.hits.Probe`: the hit pages, how many are cached-free, and the
        other request computing the page after the hit. Memoised per table, so the
        scheduler may ask every step at O(hit pages) cost (no hashing or lookups)."""
        return self._hits.probe(pt)

    def peek_hits(self, pt: PageTable) -> int:
        """Tokens :meth:`take_hits` would take now (no side effects)."""
        return len(self._hits.match(pt)) * self.block_size

    def take_hits(self, pt: PageTable) -> int:
        """Extend the table with the longest run of published pages that continue it;
        returns the tokens taken (whole pages, at most :meth:`hit_limit_pages`). The
        first call is the admission hit; later calls (a follower polling) take pages a
        leader published meanwhile (in-flight hits)."""
        start = len(pt.pages)
        tokens = self._hits.take(pt)
        if tokens:
            self.repin(pt.pages[start:])
            self.pins.on_hit(pt.pages[start:])
        return tokens

    def repin(self, pages: list[int]) -> None:
        """Published pages just hit or loaded from a KV tier: pin again those a demoted
        pin waits for (:meth:`.pins.PinRegistry.on_reload`)."""
        if self.pins.demotion.waiting:
            ph = self.index.page_hash
            self.pins.on_reload(pages, [ph[p] or b"" for p in pages])

    def next_page_owner(self, pt: PageTable, ahead: int = 0) -> str | None:
        """The request computing this table's next needed page (``ahead`` pages past
        its end), if another request is. ``None`` when that page is not in flight, is
        owned by this request, lies beyond the hit limit, or the table holds a partial
        page of its own."""
        return self._hits.next_owner(pt, ahead)

    def peek_inflight(self, pt: PageTable, hit_tokens: int) -> bool:
        """Whether the page after a hit of ``hit_tokens`` (from :meth:`peek_hits`) is
        in flight, owned by another request."""
        return self.next_page_owner(pt, hit_tokens // self.block_size) is not None

    def wait(self, pt: PageTable) -> bool:
        """Whether the table's next page is in flight by another request, so it can
        follow (poll :meth:`take_hits`). Keeps no state: there is nothing to undo."""
        return self.next_page_owner(pt) is not None

    # -- pins and quotas --------------------------------------------------------------
    def pin(self, pt: PageTable, num_pages: int, ttl_s: float) -> Pin:
        """Pin the table's first ``num_pages`` pages (its prefix from the chain root) for
        ``ttl_s`` seconds, once they are published (:mod:`.pins`). Pages it could not
        publish (a collision, a dead chain) end the pinned prefix there.

        Raises:
            ValueError: ``ttl_s <= 0``, or none of those pages is published.
            PinCapError: the pin does not fit under ``max_pinned_fraction``.
        """
        return self.pins.pin_table(self.index, self.keys, pt, num_pages, ttl_s)

    def _victim(self, tenant: Hashable) -> int | None:
        """The page an allocation by ``tenant`` evicts; expired pins are collected
        before a pinned page is chosen (lazy expiry)."""
        page = self.quotas.victim(self.pool, tenant)
        if page is not None and self.pool.pinned[page] and self.pins.expire():
            page = self.quotas.victim(self.pool, tenant)
        if self.drop_log is not None and page is not None:  # the tenant recycles its own
            limit = self.quotas.limit(tenant)
            own = (limit is not None and self.pool.owner[page] == tenant
                   and self.pool.usage[tenant] >= limit)
            self._quota_victim = page if own else None
        return page

    def close_connector(self) -> None:
        """Close the connector (:meth:`.connector.KVConnector.close`: the tiers write
        the cached pages down), then stop handing it evictions and pins: from here on an
        evicted pinned page lapses its pins, and the pool serves alone. Idempotent."""
        self.connector.close()
        self._alloc.on_evict = None
        self.pins.demotion.enabled, self.pins.demotion.hook = False, None

    # -- allocation --------------------------------------------------------------------
    def pages_needed(self, pt: PageTable, num_new_tokens: int) -> int:
        """New pages :meth:`allocate` would take for ``num_new_tokens`` more tokens."""
        return self._alloc.pages_needed(pt, num_new_tokens)

    def can_allocate(self, num_pages: int) -> bool:
        return num_pages <= self.pool.num_allocatable

    def allocate(self, pt: PageTable, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` tokens after ``num_computed_tokens``: new
        private pages (evicting the least recently used cached-free ones under pressure),
        and full prompt pages not yet published registered in flight, owned by this
        request (:mod:`.allocation`). ``False`` (nothing changed) if the pool cannot
        supply the pages.

        Raises:
            ValueError: the range goes past the request's known tokens.
        """
        return self._alloc.allocate(pt, num_new_tokens)

    # -- parallel samples -------------------------------------------------------------
    def fork(self, parent: PageTable, child: PageTable) -> list[tuple[int, int]] | None:
        """Give ``child`` the parent's KV up to ``parent.num_computed_tokens``, as the
        parallel samples of one prompt need (``engine/sample_group.py``). ``child`` is a
        new, empty table of the same namespace whose tokens start with those the parent
        computed. Published full pages are shared (one more holder each); the partial
        last page and full pages that are not published (caching off, a private
        duplicate) get new private pages, never a write into a shared page. The caller
        copies the returned ``(source, destination)`` page pairs before any step writes
        either table. Counted in ``fork_shared_pages`` / ``fork_copied_pages``.

        Returns:
            The page pairs to copy, or ``None`` (nothing changed) if the pool cannot
            supply the new pages.

        Raises:
            ValueError: ``child`` holds pages, or its namespace or tokens differ.
        """
        bs, pool = self.block_size, self.pool
        n = parent.num_computed_tokens
        if child.pages or child.num_computed_tokens:
            raise ValueError(f"fork into {child.request_id!r}: the table is not empty")
        if (child.root_hash != parent.root_hash or child.page_extra != parent.page_extra
                or child.mm_hashes != parent.mm_hashes or child.tenant != parent.tenant
                or child.token_ids[:n] != parent.token_ids[:n]):
            raise ValueError(f"fork into {child.request_id!r}: namespace or tokens differ "
                             f"from {parent.request_id!r}")
        full = n // bs
        pages = parent.pages[:-(-n // bs)]
        shared = [i < full and pool.state[p] == PageState.PUBLISHED
                  for i, p in enumerate(pages)]
        need = shared.count(False)
        if need > pool.num_allocatable:
            return None
        new = iter(self._alloc.new_pages(child.tenant, need))
        copies = []
        for page, share in zip(pages, shared):
            if share:
                pool.incref(page)
                child.pages.append(page)
            else:
                dst = next(new)
                child.pages.append(dst)
                copies.append((page, dst))
        child.chain_refs = list(parent.chain_refs[:full])
        child.hashes = list(parent.hashes[:full])  # same tokens, same chain: not hashed again
        child.dup_positions = [i for i in parent.dup_positions if i < full]
        child.num_computed_tokens = n
        child.admitted = True
        self.counters.fork_shared_pages += len(pages) - len(copies)
        self.counters.fork_copied_pages += len(copies)
        return copies

    # -- after a step ------------------------------------------------------------------
    def commit(self, pt: PageTable, num_new_tokens: int) -> int:
        """The step that wrote ``num_new_tokens`` tokens completed without error:
        advance ``num_computed_tokens`` and publish every page now full (prompt or
        decode pages; see :mod:`.publish`). Returns the pages published.

        Raises:
            ValueError: more tokens than were allocated or are known.
        """
        return self._publisher.commit(pt, num_new_tokens)

    def fail_step(self, pt: PageTable) -> None:
        """The step that was to write this table's new tokens failed or was cancelled:
        nothing is published and its in-flight registrations are withdrawn (followers
        take over). The table stays as it was before the step."""
        self.inflight.withdraw(pt.request_id)

    def free(self, pt: PageTable) -> None:
        """Release all of a table's pages (finish, abort, preemption, error), last
        first, so a prefix's tail is evicted before its head. Withdraws its in-flight
        registrations. Idempotent."""
        if self.tables.get(pt.request_id) is not pt:
            return
        self.inflight.withdraw(pt.request_id)
        for page in reversed(pt.pages):
            self.pool.decref(page)
        pt.pages, pt.chain_refs, pt.dup_positions = [], [], []
        del self.tables[pt.request_id]

    def _evict(self, page: int) -> None:
        """Allocation evicts a cached-free page: while the connector takes evictions
        (write-back), its pins are demoted with it rather than lapsing
        (:mod:`.pin_demotion`)."""
        if self.pool.pinned[page] and self.pins.held_by_session(page):
            self.pins.counters["session_pages_evicted"] += 1  # a forced eviction
        if self.pool.pinned[page] and self._alloc.on_evict is not None:
            self.pins.on_drop(page, evicted=True)
        self.drop_cached(page, "quota" if page == self._quota_victim else "pool")

    def drop_cached(self, page: int, cause: str | None = None) -> None:
        """Drop a cached-free page: its hash leaves the index and the page returns to
        the free queue (``CACHED_FREE -> FREE``). The one way a cached page goes:
        eviction, :meth:`reset`, supersede and TTL expiry (:mod:`.expiry`) use it.
        ``cause`` (a :data:`.miss_diagnosis.DROP_CAUSES` key; ``None``: the hash stays
        published elsewhere) is recorded in :attr:`drop_log` when one is kept.

        Raises:
            PoolError: the page is not cached-free.
        """
        log, lapsed = self.drop_log, self.pins.lapsed
        pin_lapsed = lapsed is not None and page in lapsed
        if pin_lapsed:  # on every drop: a page reused later must not inherit it
            lapsed.discard(page)  # type: ignore[union-attr]
        if log is not None and cause is not None:
            h = self.index.page_hash[page]
            if pin_lapsed and cause == "pool":
                cause = "pin"
            if h is not None:
                log.record(self.pool.owner[page], h, cause)
        if self.pool.pinned[page]:
            self.pins.on_drop(page)  # its pins lapse
        self.pool.unpublish_cached(page)  # it raises for any state but cached-free
        self.index.remove(page)

    def record_drops(self, log: DropLog) -> None:
        """Keep ``log`` of the pages dropped from now on, per tenant and why (what a
        miss diagnosis reads: :mod:`.miss_diagnosis`). One dict insert per drop."""
        self.drop_log = log
        self.pins.lapsed = set()

    def record_events(self) -> CacheEventLog:
        """Start recording every page entering or leaving the index (for KV events);
        the caller drains the returned log. Idempotent."""
        if self.index.events is None:
            self.index.events = CacheEventLog(self.block_size)
        return self.index.events

    # -- accounting --------------------------------------------------------------------
    def record_query(self, num_prompt_tokens: int, num_cached_tokens: int,
                     num_inflight_hit_tokens: int = 0) -> None:
        """Count one request's prefix-cache query, once, when its ``num_cached_tokens``
        is final (its first prefill completed). All in tokens."""
        c = self.counters
        c.prefix_cache_queries += num_prompt_tokens
        c.prefix_cache_hits += num_cached_tokens
        c.inflight_hits += num_inflight_hit_tokens

    def stats(self) -> dict[str, int | float]:
        """Counters (tokens / pages, monotonic) and gauges (pages, current)."""
        return snapshot(self.counters, self.pool, self.index, self.inflight) | (
            self.pins.stats())

    def reset(self) -> ResetReport:
        """Clear the prefix cache without touching running requests: every cached-free
        page is dropped (:meth:`drop_cached`). Pages held by running requests stay
        published (their KV is complete) and become evictable when released."""
        dropped = self.pool.cached_pages()
        for page in dropped:
            self.drop_cached(page, "reset")
        self.counters.reset_dropped_pages += len(dropped)
        kept = sum(1 for s in self.pool.state if s == PageState.PUBLISHED)
        return ResetReport(dropped_pages=len(dropped), kept_in_use_pages=kept)
