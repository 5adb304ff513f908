"""Allocation: private pages for a step's new tokens, evicting under pressure, and the
in-flight registration of the full prompt pages the step will compute.

New pages come from the free queue; when it is empty a cached-free page is dropped
(``KVCacheManager.drop_cached``) and taken: the least recently used unpinned one, or the
one the tenant quotas choose (``victim``, :mod:`.quotas`). A full page in
the range whose hash is neither published nor in flight is registered as in flight,
owned by the table's request, so a request with the same prefix follows instead of
computing it too (DESIGN.md, "Coordination").
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import NamedTuple

from prefixcache.cache.inflight import InflightRegistry
from prefixcache.cache.page_keys import PageKeys
from prefixcache.cache.page_pool import PagePool
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex
from prefixcache.cache.stats import CacheCounters


class EvictedPage(NamedTuple):
    """A published page being evicted: its pool id, hash and token bytes (``<I`` per
    token). Its KV is intact until the next model step writes the page."""

    page: int
    page_hash: bytes
    token_bytes: bytes


EvictHook = Callable[[list[EvictedPage]], None]


class Allocator:
    """Allocates pages of one pool to page tables.

    Args:
        enabled: prefix caching on; when off nothing is registered in flight.
        drop_cached: the manager's single "drop a cached page" operation.
        victim: ``victim(tenant)``, the cached-free page an allocation by that tenant
            evicts; default the pool's order (unpinned LRU, then pinned).
    """

    def __init__(self, pool: PagePool, index: PrefixIndex, inflight: InflightRegistry,
                 keys: PageKeys, counters: CacheCounters, drop_cached: Callable[[int], None],
                 enabled: bool, victim: Callable[[Hashable], int | None] | None = None):
        self.pool, self.index, self.inflight, self.keys = pool, index, inflight, keys
        self.victim = victim or (lambda tenant: pool.oldest_cached())
        self.counters, self.drop_cached, self.enabled = counters, drop_cached, enabled
        self.block_size = keys.block_size
        self.on_evict: EvictHook | None = None  # the connector's, when it writes back

    def pages_needed(self, pt: PageTable, num_new_tokens: int) -> int:
        """New pages for ``num_new_tokens`` more tokens after ``num_computed_tokens``."""
        total = pt.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(pt.pages))

    def new_pages(self, tenant: Hashable, count: int) -> list[int]:
        """Take ``count`` pending pages (ref 1) for ``tenant``, evicting cached-free pages
        when the free queue is empty; the caller checked ``num_allocatable`` and puts
        them in a page table."""
        pool = self.pool
        evicted: list[EvictedPage] = []
        pages: list[int] = []
        for _ in range(count):
            if not pool.num_free:  # evict a cached-free page (quotas, then LRU, pins last)
                victim: int = self.victim(tenant)  # type: ignore[assignment]
                if self.on_evict is not None:
                    key = self.index.page_key[victim]
                    h = self.index.page_hash[victim]
                    if key is not None and h is not None:
                        evicted.append(EvictedPage(victim, h, key[1]))
                self.drop_cached(victim)
                self.counters.evictions += 1
            pages.append(pool.pop_free(tenant))  # type: ignore[arg-type]
        if evicted and self.on_evict is not None:
            self.on_evict(evicted)  # before any step overwrites them
        return pages

    def allocate(self, pt: PageTable, num_new_tokens: int) -> bool:
        """See ``KVCacheManager.allocate``; ``False`` (nothing changed) if the pool
        cannot supply the pages.

        Raises:
            ValueError: the range goes past the request's known tokens.
        """
        bs, pool = self.block_size, self.pool
        end = pt.num_computed_tokens + num_new_tokens
        if end > len(pt.token_ids):
            raise ValueError(f"cannot schedule {num_new_tokens} tokens: only "
                             f"{len(pt.token_ids) - pt.num_computed_tokens} are known")
        need = self.pages_needed(pt, num_new_tokens)
        if need > pool.num_allocatable:
            return False
        pt.pages.extend(self.new_pages(pt.tenant, need))
        if self.enabled and None not in pt.chain_refs[-1:]:
            first = max(pt.num_computed_tokens // bs, len(pt.chain_refs))
            last = min(-(-end // bs), len(pt.token_ids) // bs)
            if last > first:
                hashes = self.keys.hashes(pt, last)
                for i in range(first, last):
                    if hashes[i] not in self.index:
                        self.inflight.register(hashes[i], pt.request_id)
        return True
