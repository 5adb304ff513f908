"""Bounded vector indexes, one per scope, for the semantic cache.

A scope is the exact layer-1 key minus the last user turn (tenant, model, system prompt,
tools, parameters, earlier history), so a search only ever sees the entries of its own
scope: one tenant's entries are never scored for another (DESIGN: layers in front of the
engine keep the same isolation). Each scope holds a usearch HNSW index (cosine) and its
entries; bounds: ``max_scopes`` (LRU over scopes), ``max_entries_per_scope`` and
``max_entries`` (LRU over entries), ``max_bytes`` (text + value + vector bytes) and a TTL.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from usearch.index import Index


@dataclass
class Entry:
    """One cached answer: the user turn it answered, its unit vector and the response bytes."""

    text: str
    vector: np.ndarray   # float32 [dim], L2 norm 1
    value: bytes
    created: float       # wall-clock seconds (time.time()), for the TTL

    @property
    def nbytes(self) -> int:
        return len(self.text.encode()) + len(self.value) + self.vector.nbytes


@dataclass(frozen=True)
class Candidate:
    """A search result: cosine ``score`` in [-1, 1] (1.0 only for identical text)."""

    entry: Entry
    score: float


class ScopeIndex:
    """The entries of one scope: a usearch index keyed by int ids, in LRU order."""

    def __init__(self, dim: int) -> None:
        self.index = Index(ndim=dim, metric="cos", dtype="f32")
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self.by_text: dict[str, int] = {}
        self._next_id = 0

    def add(self, entry: Entry) -> int:
        """Insert ``entry`` (replacing one with the same text) -> bytes freed by the replace."""
        freed = self.remove_text(entry.text)
        key = self._next_id
        self._next_id += 1
        self.index.add(key, entry.vector)
        self.entries[key] = entry
        self.by_text[entry.text] = key
        return freed

    def remove(self, key: int) -> int:
        """Drop entry ``key`` -> its bytes (0 when absent)."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return 0
        self.index.remove(key)
        self.by_text.pop(entry.text, None)
        return entry.nbytes

    def remove_text(self, text: str) -> int:
        key = self.by_text.get(text)
        return 0 if key is None else self.remove(key)

    def pop_lru(self) -> int:
        """Drop the least recently used entry -> its bytes."""
        return self.remove(next(iter(self.entries)))

    def search(self, vector: np.ndarray, text: str, k: int) -> list[tuple[int, Candidate]]:
        """Up to ``k`` nearest entries to ``vector`` -> (key, candidate), best first."""
        if not self.entries:
            return []
        found = self.index.search(vector, min(k, len(self.entries)))
        out = []
        for key in np.asarray(found.keys).tolist():
            entry = self.entries.get(int(key))
            if entry is None:
                continue
            out.append((int(key), Candidate(entry, _score(vector, entry, text))))
        out.sort(key=lambda kc: -kc[1].score)
        return out

    def touch(self, key: int) -> None:
        self.entries.move_to_end(key)


def _score(vector: np.ndarray, entry: Entry, text: str) -> float:
    """Exact cosine of unit vectors; 1.0 is reserved for identical text."""
    if entry.text == text:
        return 1.0
    dot = float(np.dot(vector.astype(np.float64), entry.vector.astype(np.float64)))
    return min(dot, float(np.nextafter(1.0, 0.0)))


class ScopedIndex:
    """Vector indexes partitioned by scope, with global bounds.

    ``dim``: vector size; ``ttl_s``: entry lifetime in seconds (None: no TTL); ``clock``:
    the time source (``time.time`` by default; tests pass their own). Raises ``ValueError``
    naming the parameter when a bound is below 1.
    """

    def __init__(self, dim: int, max_scopes: int = 10_000, max_entries_per_scope: int = 1_000,
                 max_entries: int = 100_000, max_bytes: int = 256 << 20,
                 ttl_s: float | None = 3600.0, clock: Callable[[], float] = time.time) -> None:
        for name, val in (("dim", dim), ("max_scopes", max_scopes),
                          ("max_entries_per_scope", max_entries_per_scope),
                          ("max_entries", max_entries), ("max_bytes", max_bytes)):
            if val < 1:
                raise ValueError(f"{name} must be >= 1, got {val}")
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0 or None, got {ttl_s}")
        self.dim, self.ttl_s, self.clock = dim, ttl_s, clock
        self.max_scopes, self.max_entries_per_scope = max_scopes, max_entries_per_scope
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.scopes: OrderedDict[bytes, ScopeIndex] = OrderedDict()
        self.num_entries = 0
        self.nbytes = 0
        self.evictions = 0
        self.expirations = 0

    def add(self, scope: bytes, entry: Entry) -> bool:
        """Store ``entry`` under ``scope``, evicting LRU entries/scopes to stay in bounds.

        Returns False (stores nothing) when the entry alone exceeds ``max_bytes``, is already
        expired, or its vector is not ``[dim]``.
        """
        if entry.nbytes > self.max_bytes or entry.vector.shape != (self.dim,):
            return False
        if self._expired(entry):
            return False
        idx = self.scopes.get(scope)
        if idx is None:
            idx = self.scopes[scope] = ScopeIndex(self.dim)
        self.scopes.move_to_end(scope)
        had = len(idx.entries)
        self.nbytes -= idx.add(entry)
        self.num_entries += len(idx.entries) - had
        self.nbytes += entry.nbytes
        while len(idx.entries) > self.max_entries_per_scope:
            self.evictions += 1
            self._drop(idx, idx.pop_lru())
        self._enforce(keep=scope)
        return True

    def search(self, scope: bytes, vector: np.ndarray, text: str, k: int = 4) -> list[Candidate]:
        """Up to ``k`` live candidates of ``scope`` nearest to ``vector`` (``[dim]``), best first.

        Expired entries met on the way are removed. A search never looks at another scope.
        """
        idx = self.scopes.get(scope)
        if idx is None:
            return []
        self.scopes.move_to_end(scope)
        out = []
        for key, cand in idx.search(vector, text, k):
            if self._expired(cand.entry):
                self.expirations += 1
                self._drop(idx, idx.remove(key))
                continue
            out.append(cand)
        if not idx.entries:
            del self.scopes[scope]
        return out

    def touch(self, scope: bytes, text: str) -> None:
        """Mark the entry of ``scope`` with ``text`` as just used (it was served)."""
        idx = self.scopes.get(scope)
        key = idx.by_text.get(text) if idx else None
        if idx is not None and key is not None:
            idx.touch(key)

    def __len__(self) -> int:
        return self.num_entries

    def _expired(self, entry: Entry) -> bool:
        return self.ttl_s is not None and self.clock() - entry.created >= self.ttl_s

    def _drop(self, idx: ScopeIndex, freed: int) -> None:
        if freed:
            self.num_entries -= 1
            self.nbytes -= freed

    def _enforce(self, keep: bytes) -> None:
        while len(self.scopes) > self.max_scopes:
            scope, idx = next(iter(self.scopes.items()))
            if scope == keep:
                break
            self.num_entries -= len(idx.entries)
            self.nbytes -= sum(e.nbytes for e in idx.entries.values())
            self.evictions += len(idx.entries)
            del self.scopes[scope]
        while self.num_entries > self.max_entries or self.nbytes > self.max_bytes:
            scope, idx = next(iter(self.scopes.items()))
            self.evictions += 1
            self._drop(idx, idx.pop_lru())
            if not idx.entries:
                del self.scopes[scope]
