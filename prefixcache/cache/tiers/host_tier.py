"""L2: page groups in host RAM under a byte budget, least recently used evicted first.

Pinned pages (TTL pins demoted from the pool, :mod:`.tier_pins`) are evicted only after
every unpinned page, within their byte cap.

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
from prefixcache.cache.tiers.tier_pins import TierPins


class HostTier:
    """Host-RAM tier.

    Args:
        capacity_bytes: payload byte budget (>= 1).
        max_pinned_fraction: share of the budget pinned pages may hold (``[0, 1]``).

    Raises:
        ValueError: ``capacity_bytes < 1`` or ``max_pinned_fraction`` outside ``[0, 1]``."""

    name = "host"

    def __init__(self, capacity_bytes: int, max_pinned_fraction: float = 0.0):
        if capacity_bytes < 1:
            raise ValueError(f"capacity_bytes must be >= 1, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.pins = TierPins(capacity_bytes, max_pinned_fraction)
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

    def get(self, hashes: Sequence[bytes],
            token_ids: Sequence[Sequence[int]] | None = None) -> PageGroup | None:
        """The leading pages held (see :meth:`.base.Tier.get`); a page holding other token
        ids than ``token_ids`` says is dropped and counted as corrupt."""
        with self._lock:
            pages: list[PageGroup] = []
            for i, h in enumerate(hashes):
                page = self._pages.get(h)
                if page is None:
                    break
                if token_ids is not None and page.token_ids[0] != tuple(token_ids[i]):
                    self._drop(h)
                    self._stats.corrupt += 1
                    break
                pages.append(page)
                self._pages.move_to_end(h)
            self._stats.misses += len(pages) < len(hashes)
            if not pages:
                return None
            self._stats.hits += 1
            self._stats.loads += 1
            self._stats.load_bytes += sum(len(p.payload) for p in pages)
        first = pages[0]
        return PageGroup(first.fingerprint, tuple(hashes[:len(pages)]),
                         tuple(p.token_ids[0] for p in pages), first.dtype, first.page_shape,
                         b"".join(p.payload for p in pages))

    def _drop(self, page_hash: bytes) -> None:
        self._used -= len(self._pages.pop(page_hash).payload)
        self.pins.release(page_hash)

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
            if self._used + need > self.capacity_bytes:
                self._make_room(need, set(group.hashes))
            for h in new:
                self._pages[h] = group.select([h])
                if h in self.pins.wanted:
                    self.pins.admit(h, group.page_nbytes)
            self._used += need
            self._stats.stores += 1
            self._stats.store_bytes += need
            return True

    def _make_room(self, need: int, protect: set[bytes]) -> None:
        """Evict least recently used pages until ``need`` more bytes fit: unpinned ones
        first, then pinned ones; never a page of ``protect`` (the group being stored).
        O(pages evicted + pages skipped); the pinned pages skipped are capped."""
        victims: list[bytes] = []
        room = self.capacity_bytes - self._used - need
        for pinned in (False, True):
            for h, page in self._pages.items():  # oldest first; collected, then popped
                if room >= 0:
                    break
                if h not in protect and (h in self.pins) == pinned:
                    victims.append(h)
                    room += len(page.payload)
        for h in victims:
            self._used -= len(self._pages.pop(h).payload)
            self.pins.release(h, evicted=True)
            self._stats.evictions += 1

    def set_pinned(self, hashes: Sequence[bytes], pinned: bool) -> None:
        """Mark page hashes pinned (held now or stored later) or no longer pinned."""
        with self._lock:
            self.pins.want(hashes, pinned)
            for h in hashes:
                page = self._pages.get(h)
                if page is None:
                    continue
                if pinned:
                    self.pins.admit(h, len(page.payload))
                else:
                    self.pins.release(h)

    def stats(self) -> TierStats:
        with self._lock:
            s = TierStats(**self._stats.as_dict())
            s.pages, s.bytes_used = len(self._pages), self._used
            s.pinned_entries, s.pinned_bytes = len(self.pins.entries), self.pins.used
            s.pinned_evictions = self.pins.evictions
            return s

    def clear(self) -> int:
        """Drop every page (not counted as evictions); returns how many were held."""
        with self._lock:
            n = len(self._pages)
            self._pages.clear()
            self.pins.clear()
            self._used = 0
            return n

    def close(self) -> None:
        self.clear()
