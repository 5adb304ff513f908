"""The in-flight registry: pages being computed, who computes them, and who waits.

When a request allocates a page whose tokens are known (a prompt page) and whose hash is
neither published nor in flight, it registers the hash with itself as owner. A second
request with the same prefix then sees "in flight, owned by R" rather than a miss; it can
attach as a waiter and is told when the page publishes, or when the owner withdraws
(abort, preemption, failed step), so the engine can make it wait or take over.
"""
from __future__ import annotations

from dataclasses import dataclass

PUBLISHED = "published"
WITHDRAWN = "withdrawn"


@dataclass(frozen=True)
class Wakeup:
    """Tells waiter ``request_id`` that ``page_hash`` was published or withdrawn."""

    request_id: str
    page_hash: bytes
    reason: str  # PUBLISHED or WITHDRAWN


class InflightRegistry:
    """hash -> owner request id, owner -> its hashes, hash -> waiting request ids."""

    def __init__(self) -> None:
        self._owner: dict[bytes, str] = {}
        self._owned: dict[str, set[bytes]] = {}
        self._waiters: dict[bytes, set[str]] = {}
        self._waiting_on: dict[str, bytes] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def owner(self, page_hash: bytes) -> str | None:
        """The request computing this page, ``None`` if it is not in flight."""
        return self._owner.get(page_hash)

    def owned_by(self, request_id: str) -> set[bytes]:
        return set(self._owned.get(request_id, ()))

    def register(self, page_hash: bytes, owner: str) -> bool:
        """Register ``owner`` as computing ``page_hash``. Returns ``False`` (and changes
        nothing) if another request already owns it; ``True`` if ``owner`` now does."""
        cur = self._owner.get(page_hash)
        if cur is not None:
            return cur == owner
        self._owner[page_hash] = owner
        self._owned.setdefault(owner, set()).add(page_hash)
        return True

    def add_waiter(self, page_hash: bytes, waiter: str) -> bool:
        """Attach ``waiter`` to an in-flight page (a request waits on one page at a
        time; attaching again moves it). Returns ``False`` if the page is not in flight
        or ``waiter`` owns it."""
        owner = self._owner.get(page_hash)
        if owner is None or owner == waiter:
            return False
        self.remove_waiter(waiter)
        self._waiters.setdefault(page_hash, set()).add(waiter)
        self._waiting_on[waiter] = page_hash
        return True

    def waiting_on(self, waiter: str) -> bytes | None:
        return self._waiting_on.get(waiter)

    def remove_waiter(self, waiter: str) -> None:
        h = self._waiting_on.pop(waiter, None)
        if h is not None:
            ws = self._waiters.get(h)
            if ws is not None:
                ws.discard(waiter)
                if not ws:
                    del self._waiters[h]

    def _release(self, page_hash: bytes, reason: str) -> list[Wakeup]:
        owner = self._owner.pop(page_hash)
        owned = self._owned[owner]
        owned.discard(page_hash)
        if not owned:
            del self._owned[owner]
        woken = []
        for w in sorted(self._waiters.pop(page_hash, ())):
            del self._waiting_on[w]
            woken.append(Wakeup(w, page_hash, reason))
        return woken

    def complete(self, page_hash: bytes) -> list[Wakeup]:
        """The page was published (or its computation ended): drop the registration and
        wake its waiters. No-op if it was not in flight."""
        if page_hash not in self._owner:
            return []
        return self._release(page_hash, PUBLISHED)

    def withdraw_page(self, page_hash: bytes) -> list[Wakeup]:
        """The owner finished computing ``page_hash`` but could not publish it (its
        chain cannot be published): drop the registration and wake its waiters with
        ``WITHDRAWN`` so one can take over. No-op if it was not in flight."""
        if page_hash not in self._owner:
            return []
        return self._release(page_hash, WITHDRAWN)

    def withdraw(self, owner: str) -> list[Wakeup]:
        """``owner`` stops computing (abort, preemption, failed step): drop all its
        registrations and wake their waiters so one can take over."""
        woken: list[Wakeup] = []
        for h in sorted(self._owned.get(owner, ())):
            woken.extend(self._release(h, WITHDRAWN))
        return woken
