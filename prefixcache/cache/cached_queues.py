"""The eviction queues of cached-free pages: unpinned before pinned, per owner, LRU.

DESIGN.md, "Page lifecycle": a cached-free page waits in an LRU queue until a hit takes
it back or allocation evicts it. Pins (:mod:`.pins`) and tenant quotas (:mod:`.quotas`)
need more than one global order: pinned pages are evicted only after every unpinned one,
and a tenant over its quota evicts its own pages first. So each cached-free page sits in
two queues, both oldest first: the global queue of its class (unpinned or pinned) and
the queue of its ``(owner, pinned)`` pair. Every page carries a stamp (when it entered),
so the oldest page of several owners is the smallest stamp among their queues' heads.
All operations are O(1), except :meth:`CachedQueues.oldest_of` (O(owners asked)).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

Owner = Hashable  # a tenant (``str | None``)


class CachedQueues:
    """Cached-free pages in eviction order (see the module docstring)."""

    def __init__(self) -> None:
        self._global: dict[bool, OrderedDict[int, int]] = {False: OrderedDict(),
                                                           True: OrderedDict()}
        self._owned: dict[tuple[Owner, bool], OrderedDict[int, int]] = {}
        self._where: dict[int, tuple[Owner, bool]] = {}
        self._stamp = 0

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, page: int) -> bool:
        return page in self._where

    def add(self, page: int, owner: Owner, pinned: bool) -> None:
        """Queue a page at the most recently used end of its queues."""
        self._stamp += 1
        self._global[pinned][page] = self._stamp
        self._owned.setdefault((owner, pinned), OrderedDict())[page] = self._stamp
        self._where[page] = (owner, pinned)

    def remove(self, page: int) -> None:
        """Take a queued page out (a hit or an eviction). Raises KeyError if absent."""
        owner, pinned = self._where.pop(page)
        del self._global[pinned][page]
        q = self._owned[owner, pinned]
        del q[page]
        if not q:
            del self._owned[owner, pinned]

    def oldest(self, pinned: bool, owner: Owner = ...) -> int | None:
        """The least recently used page of a class (of one owner if given)."""
        q = self._global[pinned] if owner is ... else self._owned.get((owner, pinned))
        return next(iter(q), None) if q else None

    def oldest_of(self, owners: Iterable[Owner], pinned: bool) -> int | None:
        """The least recently used page of a class among several owners' pages."""
        best: tuple[int, int] | None = None
        for owner in owners:
            q = self._owned.get((owner, pinned))
            if q:
                page, stamp = next(iter(q.items()))
                if best is None or stamp < best[0]:
                    best = (stamp, page)
        return None if best is None else best[1]

    def count(self, pinned: bool) -> int:
        return len(self._global[pinned])

    def pages(self) -> list[int]:
        """Every queued page in eviction order: unpinned oldest first, then pinned."""
        return list(self._global[False]) + list(self._global[True])
