"""Which entries of one tier are pinned (TTL pins demoted from the pool), within a byte cap.

The engine tells a tier which page hashes are pinned (:meth:`TierPins.want`); a tier
entry holding a wanted hash is *pinned* while the pinned bytes fit under
``floor(max_pinned_fraction * capacity_bytes)``. Pinned entries are evicted only after
every unpinned one; an entry that does not fit under the cap is stored as an ordinary
one (evictable like the others), so pins never starve the tier. An entry is a page
(host RAM) or a file (disk); the tier keys it. Tenants are unknown here: hashes are
already rooted in the tenant's namespace. Not thread-safe: the tier's lock guards it.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable


class TierPins:
    """Pinned entries of one tier.

    Args:
        capacity_bytes: the tier's byte budget.
        max_pinned_fraction: share of it pinned entries may hold (``[0, 1]``).

    Raises:
        ValueError: ``max_pinned_fraction`` outside ``[0, 1]``.
    """

    def __init__(self, capacity_bytes: int, max_pinned_fraction: float):
        if not 0.0 <= max_pinned_fraction <= 1.0:
            raise ValueError(f"max_pinned_fraction must be in [0, 1], got "
                             f"{max_pinned_fraction}")
        self.cap_bytes = int(max_pinned_fraction * capacity_bytes)
        self.wanted: set[bytes] = set()       # page hashes the engine has pinned
        self.entries: dict[Hashable, int] = {}  # pinned entry -> its bytes
        self.used = 0                          # bytes of pinned entries (<= cap_bytes)
        self.evictions = 0                     # pinned entries evicted (counter)

    def __contains__(self, entry: Hashable) -> bool:
        return entry in self.entries

    def want(self, hashes: Iterable[bytes], pinned: bool) -> None:
        """Mark page hashes pinned (or no longer); the tier then calls :meth:`admit` or
        :meth:`release` for the entries holding them."""
        if pinned:
            self.wanted.update(hashes)
        else:
            self.wanted.difference_update(hashes)

    def any_wanted(self, hashes: Iterable[bytes]) -> bool:
        return any(h in self.wanted for h in hashes)

    def admit(self, entry: Hashable, nbytes: int) -> bool:
        """Count an entry as pinned if it fits under the cap; whether it is pinned."""
        if entry in self.entries:
            return True
        if self.used + nbytes > self.cap_bytes:
            return False
        self.entries[entry] = nbytes
        self.used += nbytes
        return True

    def release(self, entry: Hashable, evicted: bool = False) -> None:
        """The entry is no longer pinned (unpinned, expired or evicted); no-op if not."""
        nbytes = self.entries.pop(entry, None)
        if nbytes is not None:
            self.used -= nbytes
            self.evictions += evicted

    def clear(self) -> None:
        """Every entry left the tier (the wanted hashes stay: their pins are alive)."""
        self.entries.clear()
        self.used = 0
