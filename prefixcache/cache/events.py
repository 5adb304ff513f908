"""KV cache events: what entered and left one pool's prefix index, in order.

DESIGN.md, "One key everywhere": events name pages by their page hash (the tenant-rooted
chain), so a router that computes the same chain can match them without seeing tenants.
The prefix index reports every insert (a page became readable) and every remove
(eviction, reset, supersede, expiry) to a :class:`CacheEventLog`; the engine drains the
log after each step and publishes it (``engine/kv_events.py``, vLLM's wire schema).

Consecutive inserts along one chain merge into one :class:`PageStored` (the common case:
a prefill publishes its pages in order). The log is bounded: past ``max_events`` it
forgets what it holds and records one :class:`AllPagesCleared`, which tells consumers to
drop everything they know of this pool (they lose affinity, never correctness).
Torch-free: hashes and token ids only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.cache.hashing import bytes_to_tokens

DEFAULT_MAX_EVENTS = 100_000


@dataclass
class PageStored:
    """Pages published in chain order: ``page_hashes[0]``'s parent is ``parent_hash``
    (``None`` for the first page of a prompt), each later page's parent is the one
    before it. ``token_bytes`` holds ``block_size`` tokens per page (4 bytes each)."""

    page_hashes: list[bytes]
    parent_hash: bytes | None
    token_bytes: bytearray
    block_size: int

    @property
    def token_ids(self) -> list[int]:
        """The pages' token ids, ``block_size * len(page_hashes)`` of them."""
        return bytes_to_tokens(bytes(self.token_bytes))


@dataclass
class PageRemoved:
    """Pages whose hashes left the index (evicted, reset, superseded, expired)."""

    page_hashes: list[bytes] = field(default_factory=list)


@dataclass
class AllPagesCleared:
    """Everything this pool published before is gone (or no longer tracked)."""


CacheEvent = PageStored | PageRemoved | AllPagesCleared


class CacheEventLog:
    """Ordered, bounded record of index changes since the last :meth:`drain`.

    Args:
        block_size: tokens per page, carried by every :class:`PageStored`.
        max_events: most events held; beyond it the log collapses to one
            :class:`AllPagesCleared` and counts the overflow.

    Raises:
        ValueError: ``max_events < 1`` or ``block_size < 1``.
    """

    def __init__(self, block_size: int, max_events: int = DEFAULT_MAX_EVENTS):
        if max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {max_events}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_events = max_events
        self.overflows = 0
        self._events: list[CacheEvent] = []

    def __len__(self) -> int:
        return len(self._events)

    def stored(self, page_hash: bytes, parent_hash: bytes | None, token_bytes: bytes) -> None:
        """A page was published: its hash, its parent page's hash (``None`` for page 0)
        and its tokens (from ``hashing.tokens_to_bytes``)."""
        last = self._events[-1] if self._events else None
        if (isinstance(last, PageStored) and parent_hash is not None
                and last.page_hashes[-1] == parent_hash):
            last.page_hashes.append(page_hash)
            last.token_bytes += token_bytes
            return
        self._add(PageStored([page_hash], parent_hash, bytearray(token_bytes),
                             self.block_size))

    def removed(self, page_hash: bytes) -> None:
        """A page's hash left the index."""
        last = self._events[-1] if self._events else None
        if isinstance(last, PageRemoved):
            last.page_hashes.append(page_hash)
            return
        self._add(PageRemoved([page_hash]))

    def cleared(self) -> None:
        """Everything published before is gone: earlier events are moot."""
        self._events = [AllPagesCleared()]

    def drain(self) -> list[CacheEvent]:
        """The events since the last drain, oldest first; the log is left empty."""
        out, self._events = self._events, []
        return out

    def _add(self, event: CacheEvent) -> None:
        if len(self._events) >= self.max_events:
            self.overflows += 1
            self.cleared()
            return
        self._events.append(event)
