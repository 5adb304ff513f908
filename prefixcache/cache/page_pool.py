"""The page pool: a fixed set of KV pages, their states, ref counts and LRU eviction.

Each page is in exactly one state (see DESIGN.md, "Page lifecycle"):

- ``FREE``: in the free queue, holds nothing.
- ``PENDING``: held by a request whose model step writes its KV, or kept private by a
  request (a duplicate of a page published by someone else, or an unreachable orphan
  superseded in the index). Never readable as a hit.
- ``PUBLISHED``: KV complete, hash in the prefix index, ``ref_count >= 1``.
- ``CACHED_FREE``: published with ``ref_count == 0``: still in the index, and in the LRU
  eviction queue. A hit takes it out of the queue; allocation under pressure evicts the
  least recently used one.

"Live" pages are those with ``ref_count > 0`` (``PENDING`` or ``PUBLISHED``), so
``num_free + num_cached + num_live == num_pages`` always.

Each non-free page has an *owner* (the tenant of the request that took it from the free
queue; pages are never shared across tenants) and a *pinned* flag (set by :mod:`.pins`).
Cached-free pages wait in :class:`~.cached_queues.CachedQueues`: unpinned ones are
evicted before pinned ones, and per-owner queues let quotas (:mod:`.quotas`) pick a
tenant's own pages.

All operations are O(1). The pool knows nothing of hashes: ``KVCacheManager.drop_cached``
removes a page from the index and then returns it to the free queue
(:meth:`unpublish_cached`); eviction, reset, supersede and TTL expiry all go through it.
"""
from __future__ import annotations

import random
from collections import Counter, deque
from collections.abc import Hashable
from enum import IntEnum

from prefixcache.cache.cached_queues import CachedQueues


class PageState(IntEnum):
    FREE = 0
    PENDING = 1
    PUBLISHED = 2
    CACHED_FREE = 3


class PoolError(RuntimeError):
    """An operation would break the pool's invariants (a bug in the caller)."""


class PagePool:
    """Page states, ref counts, the free queue and the LRU queue of cached-free pages.

    Args:
        num_pages: pool size in pages (>= 1).
        shuffle_seed: if given, the free queue starts in a seeded random order, so a
            request's pages are not contiguous (used by tests).

    Raises:
        ValueError: ``num_pages < 1``.
    """

    def __init__(self, num_pages: int, shuffle_seed: int | None = None):
        if num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {num_pages}")
        self.num_pages = num_pages
        self.state = [PageState.FREE] * num_pages
        self.ref_count = [0] * num_pages
        order = list(range(num_pages))
        if shuffle_seed is not None:
            random.Random(shuffle_seed).shuffle(order)
        self._free: deque[int] = deque(order)
        self._lru = CachedQueues()  # cached-free pages, in eviction order
        self._num_live = 0
        self.owner: list[Hashable] = [None] * num_pages  # tenant of a non-free page
        self.pinned = [False] * num_pages
        self.usage: Counter[Hashable] = Counter()  # non-free pages per owner

    # -- gauges ---------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Cached-free pages: published, unreferenced, evictable."""
        return len(self._lru)

    @property
    def num_live(self) -> int:
        return self._num_live

    @property
    def num_allocatable(self) -> int:
        return len(self._free) + len(self._lru)

    # -- transitions ------------------------------------------------------------------
    def pop_free(self, owner: Hashable = None) -> int | None:
        """Take a free page for ``owner`` (a tenant): ``FREE -> PENDING``, ref 1.
        ``None`` if none is free."""
        if not self._free:
            return None
        page = self._free.popleft()
        self._hold_new(page)
        self.owner[page] = owner
        self.usage[owner] += 1
        return page

    def oldest_cached(self) -> int | None:
        """The next cached-free page to evict without quotas: the least recently used
        unpinned one, else the least recently used pinned one; ``None`` if none."""
        page = self._lru.oldest(False)
        return self._lru.oldest(True) if page is None else page

    @property
    def queues(self) -> CachedQueues:
        """The cached-free queues (read them; the pool alone changes them)."""
        return self._lru

    def set_pinned(self, page: int, pinned: bool) -> None:
        """Mark a page pinned or not. A cached-free page moves to the most recently used
        end of its new class."""
        if self.pinned[page] == pinned:
            return
        self.pinned[page] = pinned
        if page in self._lru:
            self._lru.remove(page)
            self._lru.add(page, self.owner[page], pinned)

    def _to_free(self, page: int) -> None:
        self.state[page] = PageState.FREE
        self._free.append(page)
        owner = self.owner[page]
        self.usage[owner] -= 1
        if not self.usage[owner]:
            del self.usage[owner]
        self.owner[page] = None

    def _hold_new(self, page: int) -> None:
        self.state[page] = PageState.PENDING
        self.ref_count[page] = 1
        self._num_live += 1

    def incref(self, page: int) -> None:
        """Another page table holds a published page (a hit). Takes a cached-free page
        out of the eviction queue."""
        st = self.state[page]
        if st == PageState.CACHED_FREE:
            self._lru.remove(page)
            self.state[page] = PageState.PUBLISHED
            self._num_live += 1
        elif st != PageState.PUBLISHED:
            raise PoolError(f"incref of page {page} in state {st.name}; only published "
                            "pages are shared")
        self.ref_count[page] += 1

    def decref(self, page: int) -> None:
        """A page table drops the page. At ref 0 a published page becomes cached-free
        (most recently used end of the LRU queue) and a pending page becomes free."""
        if self.ref_count[page] <= 0:
            raise PoolError(f"decref of page {page} with ref_count {self.ref_count[page]}")
        self.ref_count[page] -= 1
        if self.ref_count[page]:
            return
        self._num_live -= 1
        if self.state[page] == PageState.PUBLISHED:
            self.state[page] = PageState.CACHED_FREE
            self._lru.add(page, self.owner[page], self.pinned[page])
        else:
            self._to_free(page)

    def mark_published(self, page: int) -> None:
        """``PENDING -> PUBLISHED`` once the page's KV is complete and indexed."""
        if self.state[page] != PageState.PENDING or self.ref_count[page] < 1:
            raise PoolError(f"publish of page {page} in state {self.state[page].name}")
        self.state[page] = PageState.PUBLISHED

    def unpublish_cached(self, page: int) -> None:
        """Drop a cached-free page's contents: ``CACHED_FREE -> FREE``, at the newest end
        of the free queue. The caller removes it from the index."""
        if self.state[page] != PageState.CACHED_FREE:
            raise PoolError(f"page {page} is {self.state[page].name}, not cached-free")
        self._lru.remove(page)
        self._to_free(page)

    def unpublish_live(self, page: int) -> None:
        """Make a published page private again: ``PUBLISHED -> PENDING``. Only for a page
        held by exactly one table (its publisher), whose index entry the caller removes
        (an unreachable orphan superseded by a reachable entry with the same hash); the
        holder keeps its KV, now private."""
        if self.state[page] != PageState.PUBLISHED or self.ref_count[page] != 1:
            raise PoolError(f"page {page} is {self.state[page].name} with ref_count "
                            f"{self.ref_count[page]}, not published with one holder")
        self.state[page] = PageState.PENDING

    def cached_pages(self) -> list[int]:
        """Cached-free pages in eviction order: unpinned least recently used first, then
        pinned."""
        return self._lru.pages()

    def free_pages(self) -> list[int]:
        return list(self._free)
