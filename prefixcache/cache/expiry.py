"""Time-based expiry of cached pages (a provider's cache TTL), on the cache core.

The core evicts only under memory pressure (LRU). Providers also drop prefixes left
unused for a while. :class:`IdleExpiry` models that with the core's one operation for
dropping a cached page, :meth:`KVCacheManager.drop_cached` (the one eviction and
``reset`` use), applied only to pages idle longer than the TTL.

Pages are queued with the time of their last use; an entry is stale (skipped) when the
page was used again later or is no longer cached-free. Memory is bounded by the pool
size (``last_used``) and the uses within one TTL (the queue).
"""
from __future__ import annotations

from collections import deque

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_pool import PageState
from prefixcache.cache.page_table import PageTable


class IdleExpiry:
    """Drops cached-free pages unused for more than ``ttl_seconds`` (seconds).

    Raises:
        ValueError: ``ttl_seconds <= 0``.
    """

    def __init__(self, mgr: KVCacheManager, ttl_seconds: float):
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be > 0, got {ttl_seconds}")
        self.mgr = mgr
        self.ttl = ttl_seconds
        self.last_used: dict[int, float] = {}
        self._queue: deque[tuple[float, int]] = deque()
        self.expired_pages = 0

    def touch(self, pt: PageTable, now: float) -> None:
        """Mark every page of a table used at ``now`` (call before freeing it; times
        must not decrease)."""
        for page in pt.pages:
            self.last_used[page] = now
            self._queue.append((now, page))

    def expire(self, now: float) -> int:
        """Drop pages idle since before ``now - ttl``; returns how many."""
        cutoff = now - self.ttl
        state = self.mgr.pool.state
        n = 0
        while self._queue and self._queue[0][0] < cutoff:
            t, page = self._queue.popleft()
            if self.last_used.get(page) != t:
                continue  # used again later: a newer entry stands for it
            del self.last_used[page]
            if state[page] == PageState.CACHED_FREE:
                self.mgr.drop_cached(page, "ttl")
                n += 1
        self.expired_pages += n
        return n
