"""The router's page index: which replica holds which page hash, bounded.

DESIGN.md, "One key everywhere": entries are the engines' page hashes (tenant-rooted
chains), so a request can only ever match pages of its own namespace.

Two kinds of entries per (page hash, replica):

- *confirmed*: a replica's KV event said the page was stored; it stays until a removal
  event, a clear of that replica, or eviction from this index;
- *approximate*: the router itself just sent the prompt there, so the pages will most
  likely be there soon; such an entry expires after ``approx_ttl_s`` unless an event
  confirms it.

Dropping a replica (it restarted, left, or its event stream has a gap) is O(1): each
replica has an epoch, and entries of an older epoch are dead (they are pruned when seen
and age out of the LRU order). The index holds at most ``max_pages`` hashes, least
recently stored or matched evicted first, whatever the number of prompts seen.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_MAX_PAGES = 1 << 20
DEFAULT_APPROX_TTL_S = 30.0


class PageIndex:
    """Page hash -> replicas holding it.

    Args:
        max_pages: most page hashes held (>= 1).
        approx_ttl_s: lifetime of an approximate entry, seconds (> 0).

    Raises:
        ValueError: a bound out of range (the message names it).
    """

    def __init__(self, max_pages: int = DEFAULT_MAX_PAGES,
                 approx_ttl_s: float = DEFAULT_APPROX_TTL_S):
        if max_pages < 1:
            raise ValueError(f"max_pages must be >= 1, got {max_pages}")
        if not approx_ttl_s > 0:
            raise ValueError(f"approx_ttl_s must be > 0, got {approx_ttl_s}")
        self.max_pages = max_pages
        self.approx_ttl_s = approx_ttl_s
        # hash -> {replica: (epoch, expiry)}; expiry is inf for confirmed entries
        self._entries: OrderedDict[bytes, dict[int, tuple[int, float]]] = OrderedDict()
        self._epoch: dict[int, int] = {}
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, replica: int, hashes: Sequence[bytes], expiry: float) -> None:
        epoch = self._epoch.setdefault(replica, 0)
        entries = self._entries
        for h in hashes:
            holders = entries.get(h)
            if holders is None:
                holders = entries[h] = {}
            else:
                entries.move_to_end(h)
            old = holders.get(replica)
            if old is not None and old[0] == epoch and old[1] > expiry:
                continue  # never shorten a confirmed (or longer-lived) entry
            holders[replica] = (epoch, expiry)
        while len(entries) > self.max_pages:
            entries.popitem(last=False)
            self.evicted += 1

    def stored(self, replica: int, hashes: Sequence[bytes]) -> None:
        """A KV event: ``replica`` published these pages (confirmed entries)."""
        self._put(replica, hashes, math.inf)

    def approximate(self, replica: int, hashes: Sequence[bytes], now: float) -> None:
        """The router sent these pages' prompt to ``replica`` at ``now`` (seconds)."""
        self._put(replica, hashes, now + self.approx_ttl_s)

    def removed(self, replica: int, hashes: Sequence[bytes]) -> None:
        """A KV event: ``replica`` dropped these pages."""
        for h in hashes:
            holders = self._entries.get(h)
            if holders is not None and holders.pop(replica, None) is not None and not holders:
                del self._entries[h]

    def clear(self, replica: int) -> None:
        """Forget everything about ``replica`` (restart, gap, unhealthy, left). O(1)."""
        self._epoch[replica] = self._epoch.get(replica, 0) + 1

    def apply(self, replica: int, kind: str, hashes: Sequence[bytes]) -> None:
        """One KV event of ``replica`` as the subscriber delivers it: ``stored``,
        ``removed``, or anything else (``cleared``, a gap) to clear."""
        if kind == "stored":
            self.stored(replica, hashes)
        elif kind == "removed":
            self.removed(replica, hashes)
        else:
            self.clear(replica)

    def match(self, hashes: Sequence[bytes], replicas: Sequence[int], now: float
              ) -> dict[int, int]:
        """Leading pages of ``hashes`` each replica holds (a live entry for every page
        up to there). O(matched pages x replicas)."""
        out = dict.fromkeys(replicas, 0)
        alive = set(replicas)
        epoch = self._epoch
        for i, h in enumerate(hashes):
            holders = self._entries.get(h)
            if holders is None:
                break
            for r in list(alive):
                e = holders.get(r)
                if e is None or e[0] != epoch.get(r, 0) or e[1] <= now:
                    alive.discard(r)
                else:
                    out[r] = i + 1
            if not alive:
                break
            self._entries.move_to_end(h)
        return out
