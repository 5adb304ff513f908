"""Publication: a committed step's full pages enter the prefix index.

DESIGN.md, "Page lifecycle and the publication rule": a page is published only after the
step that wrote it completed. Per finalized page position ``i`` of a table:

======================================  ==============================================
index slot for the page's hash          outcome (``chain_refs[i]``)
======================================  ==============================================
empty                                   published: the table's page is indexed
the same key (an identical page)        duplicate: refer to that entry, page stays ours
another key, cached-free or a live      superseded (the slot is dropped), then
unreachable orphan held by one table    published as above
another key, live and reachable         ``None``: a true collision, the chain stops
the table's chain is dead               ``None``: nothing below it can be found
======================================  ==============================================

Whatever the outcome, the page's in-flight registration ends: followers polling it read
the published page, or take over computing it when it could not be published.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import cast

from prefixcache.cache.inflight import InflightRegistry
from prefixcache.cache.page_keys import PageKeys
from prefixcache.cache.page_pool import PagePool, PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex
from prefixcache.cache.stats import CacheCounters


def chain_alive(index: PrefixIndex, pt: PageTable) -> bool:
    """Whether every duplicate position's entry (another request's identical page) is
    still indexed; if one was dropped, the rest of the table's chain is unreachable."""
    page_of_entry = index.page_of_entry
    return all(page_of_entry(cast(int, pt.chain_refs[j])) is not None  # entry ids there
               for j in pt.dup_positions)


class Publisher:
    """Publishes a table's newly finalized pages into one pool's index.

    Args:
        drop_cached: the manager's single "drop a cached page" operation.
        enabled: prefix caching on; when off pages are finalized but never published.
    """

    def __init__(self, pool: PagePool, index: PrefixIndex, inflight: InflightRegistry,
                 keys: PageKeys, counters: CacheCounters, drop_cached: Callable[[int], None],
                 enabled: bool):
        self.pool, self.index, self.inflight = pool, index, inflight
        self.keys, self.counters, self.drop_cached = keys, counters, drop_cached
        self.enabled = enabled

    def commit(self, pt: PageTable, num_new_tokens: int) -> int:
        """See ``KVCacheManager.commit``: advance the table, publish its full pages.

        Raises:
            ValueError: more tokens than were allocated or are known.
        """
        end = pt.num_computed_tokens + num_new_tokens
        if end > len(pt.pages) * self.keys.block_size or end > len(pt.token_ids):
            raise ValueError(f"commit of {num_new_tokens} tokens past the allocated pages")
        pt.num_computed_tokens = end
        full = end // self.keys.block_size
        if len(pt.chain_refs) >= full:
            return 0
        if not self.enabled:
            pt.chain_refs.extend([None] * (full - len(pt.chain_refs)))
            return 0
        return self.publish(pt, full)

    def publish(self, pt: PageTable, full: int) -> int:
        """Finalize positions ``len(pt.chain_refs) .. full - 1`` (their KV is complete).

        Returns:
            Pages published into the index.
        """
        first = len(pt.chain_refs)
        hashes = self.keys.hashes(pt, full)
        raw, step = self.keys.raw(pt, first, full), self.keys.page_bytes
        index, counters = self.index, self.counters
        # A chain through another request's identical page dies when that page leaves
        # the index: what follows can no longer be found, so publishing it would only
        # plant orphans (which could displace reachable entries). Stop publishing.
        alive = not pt.dup_positions or chain_alive(index, pt)
        published = 0
        for i in range(first, full):
            h, page = hashes[i], pt.pages[i]
            parent = pt.root_key if i == 0 else pt.chain_refs[i - 1]
            ref = None
            if alive and parent is not None:
                j = i - first
                key = (parent, raw[j * step:(j + 1) * step], self.keys.extra(pt, i))
                existing = index.get(h)
                if existing is not None and index.page_key[existing] == key:
                    ref = index.entry_id[existing]  # identical page already published
                    pt.dup_positions.append(i)
                    counters.duplicate_pages += 1
                else:
                    if existing is not None and self._supersede(existing):
                        existing = None
                    if existing is None:
                        ref = index.insert(h, page, key)
                        self.pool.mark_published(page)
                        counters.published_pages += 1
                        published += 1
            pt.chain_refs.append(ref)
            if ref is not None or self.inflight.owner(h) == pt.request_id:
                # Readable now (ours or an identical page), or computed but not
                # publishable: either way nobody computes it any more.
                self.inflight.release(h)
        return published

    def _supersede(self, existing: int) -> bool:
        """A page with the committing (reachable) key's hash but another key holds the
        index slot. Drop it if it is cached-free (a stale orphan, or a true hash
        collision nobody holds), or if it is an unreachable orphan held only by its
        publisher (which keeps the page, now private). Returns whether the slot is free.
        A live reachable page (a true collision) is never touched."""
        index, pool = self.index, self.pool
        if pool.state[existing] == PageState.CACHED_FREE:
            self.drop_cached(existing)
            return True
        if (pool.ref_count[existing] == 1
                and not index.reachable(index.parent_of(existing))):
            index.remove(existing)
            pool.unpublish_live(existing)
            return True
        return False
