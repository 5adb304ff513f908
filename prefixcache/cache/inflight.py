"""The in-flight registry: pages being computed, and which request computes each.

When a request allocates a page whose tokens are known (a prompt page) and whose hash is
neither published nor in flight, it registers the hash with itself as owner. A second
request with the same prefix then sees "in flight, owned by R" rather than a miss
(DESIGN.md, "Coordination"): the scheduler lets it follow R, polling
``KVCacheManager.take_hits`` / ``next_page_owner`` each step, and when R publishes the
page, or withdraws it (abort, preemption, failed step), the registration is gone and the
follower reads the page or takes over computing it.

Its size is bounded by the pages of running requests: nothing here outlives them.
"""
from __future__ import annotations

from collections.abc import Iterator


class InflightRegistry:
    """hash -> owner request id, and owner -> its hashes. All operations O(1) per hash."""

    def __init__(self) -> None:
        self._owner: dict[bytes, str] = {}
        self._owned: dict[str, set[bytes]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def __iter__(self) -> Iterator[bytes]:
        """The in-flight hashes (a snapshot)."""
        return iter(list(self._owner))

    def owner(self, page_hash: bytes) -> str | None:
        """The request computing this page, ``None`` if it is not in flight."""
        return self._owner.get(page_hash)

    def register(self, page_hash: bytes, owner: str) -> bool:
        """Register ``owner`` as computing ``page_hash``. Returns ``False`` (and changes
        nothing) if another request already owns it; ``True`` if ``owner`` now does."""
        cur = self._owner.get(page_hash)
        if cur is not None:
            return cur == owner
        self._owner[page_hash] = owner
        self._owned.setdefault(owner, set()).add(page_hash)
        return True

    def release(self, page_hash: bytes) -> bool:
        """The page was published, or its owner computed it but cannot publish it: drop
        the registration. Returns whether it was in flight."""
        owner = self._owner.pop(page_hash, None)
        if owner is None:
            return False
        owned = self._owned[owner]
        owned.discard(page_hash)
        if not owned:
            del self._owned[owner]
        return True

    def withdraw(self, owner: str) -> int:
        """``owner`` stops computing (abort, preemption, failed step): drop all its
        registrations. Returns how many there were."""
        hashes = self._owned.pop(owner, ())
        for h in hashes:
            del self._owner[h]
        return len(hashes)
