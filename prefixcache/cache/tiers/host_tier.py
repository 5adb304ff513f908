"""L2: page groups in host RAM under a byte budget, least recently used evicted first.

DESIGN: "Publish-after-write in every tier": a page becomes visible when :meth:`put` has
inserted it whole. Pages are held one per entry (a chain may span stores), keyed by the
pool's page hash; the budget counts payload bytes.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from prefixcache.cache.tiers.base import TierStats
from prefixcache.cache.tiers.format import PageGroup


class HostTier:
    """Host-RAM tier.

    Args:
        capacity_bytes: payload byte budget (>= 1).

    Raises:
        ValueError: ``capacity_bytes < 1``."""

    name = "host"

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._pages: OrderedDict[bytes, PageGroup] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._stats = TierStats()

    def lookup_run(self, hashes: Sequence[bytes]) -> int:
        with self._lock:
            n = 0
            for h in hashes:
                if h not in self._pages:
                    break
                n += 1
            return n

    def contains(self, page_hash: bytes) -> bool:
        with self._lock:
            return page_hash in self._pages

    def get(self, hashes: Sequence[bytes]) -> PageGroup | None:
        with self._lock:
            try:
                pages = [self._pages[h] for h in hashes]
            except KeyError:
                self._stats.misses += 1
                return None
            for h in hashes:
                self._pages.move_to_end(h)
            self._stats.hits += 1
            self._stats.loads += 1
            self._stats.load_bytes += sum(len(p.payload) for p in pages)
        first = pages[0]
        return PageGroup(first.fingerprint, tuple(hashes),
                         tuple(p.token_ids[0] for p in pages), first.dtype, first.page_shape,
                         b"".join(p.payload for p in pages))

    def put(self, group: PageGroup) -> bool:
        with self._lock:
            new = [h for h in group.hashes if h not in self._pages]
            if not new:
                self._stats.skipped += 1
                return True
            need = len(new) * group.page_nbytes
            if group.num_pages * group.page_nbytes > self.capacity_bytes:
                self._stats.rejected += 1
                return False
            for h in group.hashes:  # never evicted by their own store
                if h in self._pages:
                    self._pages.move_to_end(h)
            while self._used + need > self.capacity_bytes:
                h0 = next(iter(self._pages))
                if h0 in group.hashes:
                    break  # only this group's own pages are left
                old = self._pages.pop(h0)
                self._used -= len(old.payload)
                self._stats.evictions += 1
            for h in new:
                self._pages[h] = group.select([h])
            self._used += need
            self._stats.stores += 1
            self._stats.store_bytes += need
            return True

    def stats(self) -> TierStats:
        with self._lock:
            s = TierStats(**self._stats.as_dict())
            s.pages, s.bytes_used = len(self._pages), self._used
            return s

    def clear(self) -> int:
        """Drop every page (not counted as evictions); returns how many were held."""
        with self._lock:
            n = len(self._pages)
            self._pages.clear()
            self._used = 0
            return n

    def close(self) -> None:
        self.clear()
