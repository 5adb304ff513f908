"""Cache counters (monotonic) and gauges (current values)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prefixcache.cache.inflight import InflightRegistry
    from prefixcache.cache.page_pool import PagePool
    from prefixcache.cache.prefix_index import PrefixIndex


@dataclass
class CacheCounters:
    """Monotonic counters.

    Attributes:
        prefix_cache_queries: prompt tokens of requests whose prefill completed (tokens).
        prefix_cache_hits: of those, tokens read from the cache (tokens); the sum of
            requests' ``num_cached_tokens``.
        inflight_hits: the part of ``prefix_cache_hits`` taken from pages that were in
            flight when the request was admitted (tokens).
        evictions: cached-free pages evicted to make room (pages).
        published_pages: pages published into the index (pages).
        duplicate_pages: full pages a request computed although an identical published
            page existed when it finished them (pages; wasted compute).
        reset_dropped_pages: pages dropped by ``reset`` (pages).
        fork_shared_pages: pages a forked table shares with its parent (parallel
            samples of one prompt; pages).
        fork_copied_pages: pages a fork copied instead (a partial last page, or a full
            page that is not published; pages).
    """

    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    inflight_hits: int = 0
    evictions: int = 0
    published_pages: int = 0
    duplicate_pages: int = 0
    reset_dropped_pages: int = 0
    fork_shared_pages: int = 0
    fork_copied_pages: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def hit_rate(self) -> float:
        """``prefix_cache_hits / prefix_cache_queries`` (0.0 before any query)."""
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else 0.0


def snapshot(counters: CacheCounters, pool: PagePool, index: PrefixIndex,
             inflight: InflightRegistry) -> dict[str, int | float]:
    """Counters (tokens / pages, monotonic), the hit rate, and gauges (pages, current):
    ``pages_total == pages_free + pages_cached + pages_live``."""
    return counters.as_dict() | {
        "hit_rate": counters.hit_rate, "hash_collisions": index.collisions,
        "pages_total": pool.num_pages, "pages_free": pool.num_free,
        "pages_cached": pool.num_cached, "pages_live": pool.num_live,
        "pages_indexed": len(index), "pages_inflight": len(inflight)}
