"""The interface every KV tier implements (host RAM, disk, a shared store), and its counters.

DESIGN: "One key everywhere": a tier is keyed by the pool's own page hashes (bytes), never by
a hash of tokens alone; "Publish-after-write in every tier": :meth:`Tier.put` makes a group
visible only once it is completely stored, and :meth:`Tier.get` returns only verified pages.
A tier holds page groups (:class:`~prefixcache.cache.tiers.format.PageGroup`) but answers per
page: a chain may span groups written at different times.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from prefixcache.cache.tiers.format import PageGroup


@dataclass
class TierStats:
    """Counters of one tier (all monotonic except ``pages`` and ``bytes_used``).

    ``stores``/``loads`` count page groups; ``*_bytes`` count value bytes moved;
    ``failures`` counts failed stores and reads; ``corrupt`` the entries that failed
    verification on read (each also removed); ``evictions`` pages evicted for budget;
    ``rejected`` groups larger than the whole budget. ``pinned_entries``/``pinned_bytes``
    are gauges of the entries held pinned (TTL pins demoted from the pool; under the
    tier's pin cap)."""

    stores: int = 0
    store_bytes: int = 0
    loads: int = 0
    load_bytes: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    failures: int = 0
    corrupt: int = 0
    rejected: int = 0
    skipped: int = 0  # stores of pages already held (no rewrite)
    pinned_evictions: int = 0  # pinned entries evicted (after every unpinned one)
    pages: int = 0
    bytes_used: int = 0
    pinned_entries: int = 0  # entries (pages, or files on disk) pinned under the cap
    pinned_bytes: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@runtime_checkable
class Tier(Protocol):
    """A byte-budgeted store of page groups under one model fingerprint.

    Implementations are thread-safe: the store worker calls :meth:`put` while the engine
    thread calls :meth:`lookup_run` and :meth:`get`."""

    name: str

    def lookup_run(self, hashes: Sequence[bytes]) -> int:
        """How many leading pages of ``hashes`` the tier holds (visible, fully stored)."""
        ...

    def get(self, hashes: Sequence[bytes],
            token_ids: Sequence[Sequence[int]] | None = None) -> PageGroup | None:
        """The leading pages of ``hashes`` that are held and verify, in that order, as one
        group (all of them, or fewer: the pages up to the first one missing or failing), or
        ``None`` when the first one does. ``token_ids`` (one sequence per hash) are the
        token ids the caller expects: a page holding others fails verification. An entry
        that fails verification is removed and counted."""
        ...

    def put(self, group: PageGroup) -> bool:
        """Store ``group``; ``True`` when its pages are now visible. Pages already held are
        not rewritten. Never raises for I/O errors: a failed store is invisible and counted."""
        ...

    def contains(self, page_hash: bytes) -> bool:
        """Whether one page is held."""
        ...

    def stats(self) -> TierStats:
        """A snapshot of the counters."""
        ...

    def close(self) -> None:
        """Release files and threads; the tier is not used afterwards."""
        ...
