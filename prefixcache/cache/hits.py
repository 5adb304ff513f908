"""Prefix-cache hits: the published pages that continue a page table, and the owner of
the next page while it is in flight (what a follower polls; DESIGN.md, "Coordination").

A hit is the longest run of leading full pages whose hashes are published *and* whose
stored keys (parent entry, token bytes, extra keys) equal the table's, so a hash
collision never serves wrong KV. It never covers the last token: at most
``(len(token_ids) - 1) // block_size`` pages.

A hit is memoised on the table: it holds while the index's generation and the table's
pages, computed tokens, finalized pages and known tokens are unchanged, so asking again
within a scheduler step (or over steps in which nothing was published or dropped) costs
no hashing, no token conversion and no lookups.
"""
from __future__ import annotations

from typing import NamedTuple

from prefixcache.cache.inflight import InflightRegistry
from prefixcache.cache.page_keys import PageKeys
from prefixcache.cache.page_pool import PagePool
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex
from prefixcache.cache.publish import chain_alive


class Probe(NamedTuple):
    """What a table would get from the cache now (``KVCacheManager.probe``)."""

    hit_pages: tuple[int, ...]  # the pages take_hits would take, in order
    num_cached_free: int        # of those, cached-free (taking them shrinks the LRU)
    next_owner: str | None      # the other request computing the page after the hit


class HitFinder:
    """Hit and following queries for the tables of one pool (no side effects), and
    :meth:`take`, which extends a table with its hit.

    Args:
        enabled: prefix caching on; when off nothing is hit or followed.
    """

    def __init__(self, pool: PagePool, index: PrefixIndex, inflight: InflightRegistry,
                 keys: PageKeys, enabled: bool):
        self.pool, self.index, self.inflight, self.keys = pool, index, inflight, keys
        self.enabled = enabled
        self.block_size = keys.block_size

    def limit(self, pt: PageTable) -> int:
        """Most leading pages the table may read: ``(len(token_ids) - 1) // block_size``,
        0 with caching off or ``read_cache=False``."""
        if not (self.enabled and pt.read_cache) or not pt.token_ids:
            return 0
        return (len(pt.token_ids) - 1) // self.block_size

    def at_boundary(self, pt: PageTable) -> bool:
        """The table ends on a page boundary of finalized pages (no partial page)."""
        n = len(pt.pages)
        return pt.num_computed_tokens == n * self.block_size and len(pt.chain_refs) == n

    def match(self, pt: PageTable) -> tuple[int, ...]:
        """Published pages continuing the table, in order; empty unless it ends on a
        page boundary of finalized pages. Memoised (see the module docstring)."""
        state = (self.index.generation, len(pt.pages), pt.num_computed_tokens,
                 len(pt.chain_refs), len(pt.token_ids))
        memo = pt.hit_memo
        if memo is not None and memo[0] == state:
            return memo[1]
        pages = tuple(self._match(pt))
        pt.hit_memo = (state, pages)
        return pages

    def probe(self, pt: PageTable) -> Probe:
        """The hit, how many of its pages are cached-free, and the owner of the page
        after it (if another request computes it)."""
        pages = self.match(pt)
        ref = self.pool.ref_count
        return Probe(pages, sum(1 for p in pages if ref[p] == 0),
                     self.next_owner(pt, len(pages)))

    def _match(self, pt: PageTable) -> list[int]:
        i, limit = len(pt.pages), self.limit(pt)
        if i >= limit or not self.at_boundary(pt):
            return []
        parent = pt.root_key if i == 0 else pt.chain_refs[i - 1]
        if parent is None or (pt.dup_positions and not chain_alive(self.index, pt)):
            return []  # no chain, or a dead one (only orphans could continue it)
        hashes = self.keys.hashes(pt, limit)
        raw, step = self.keys.raw(pt, i, limit), self.keys.page_bytes
        extras = self.keys.extras(pt, i, limit)
        single = isinstance(extras, bytes)
        lookup, entry_id = self.index.lookup, self.index.entry_id
        pages: list[int] = []
        for j in range(limit - i):
            key = (parent, raw[j * step:(j + 1) * step], extras if single else extras[j])
            page = lookup(hashes[i + j], key)
            if page is None:
                break
            pages.append(page)
            parent = entry_id[page]
        return pages

    def take(self, pt: PageTable) -> int:
        """Extend the table with :meth:`match`'s pages (each gains a holder); returns
        the tokens taken. Taken after the first call, they count as in-flight hits."""
        first = not pt.admitted
        pt.admitted = True
        pages = self.match(pt)
        for page in pages:
            self.pool.incref(page)
            pt.pages.append(page)
            pt.chain_refs.append(self.index.entry_id[page])
        tokens = len(pages) * self.block_size
        pt.num_computed_tokens += tokens
        pt.num_cached_tokens += tokens
        if not first:
            pt.num_inflight_hit_tokens += tokens
        return tokens

    def next_owner(self, pt: PageTable, ahead: int = 0) -> str | None:
        """The other request computing page ``len(pt.pages) + ahead``, if any."""
        i = len(pt.pages) + ahead
        if i >= self.limit(pt) or not self.at_boundary(pt):
            return None
        owner = self.inflight.owner(self.keys.hashes(pt, i + 1)[i])
        return owner if owner != pt.request_id else None
