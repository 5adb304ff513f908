"""Time-based expiry of cached pages (a provider's cache TTL), on the cache core.

The core evicts only under memory pressure (LRU). Providers also drop prefixes left
unused for a while. :class:`IdleExpiry` models that with the core's own operations, the
ones ``KVCacheManager.reset`` uses, applied only to the pages idle longer than the TTL:
remove the page from the prefix index and return it to the free queue.

Pages are queued with the time of their last use; an entry is stale (skipped) when the
page was used again later or is no longer cached-free.
"""
from __future__ import annotations

from collections import deque

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_pool import PageState
from prefixcache.cache.page_table import PageTable


class IdleExpiry:
    """Drops cached-free pages unused for more than ``ttl_seconds``."""

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
        pool, index = self.mgr.pool, self.mgr.index
        n = 0
        while self._queue and self._queue[0][0] < cutoff:
            t, page = self._queue.popleft()
            if self.last_used.get(page) != t or pool.state[page] != PageState.CACHED_FREE:
                continue
            index.remove(page)
            pool.unpublish_cached(page)
            del self.last_used[page]
            n += 1
        self.expired_pages += n
        return n
