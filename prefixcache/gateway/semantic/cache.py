"""The semantic cache the gateway calls (layer 2): lookup and store by (scope, last user turn).

``scope`` is a hash of the exact layer-1 key minus the last user turn (tenant, model, system
prompt, tools, parameters, earlier history): a lookup searches only that scope's index, so
another tenant, system prompt or history can never be served. ``text`` (the last user turn)
is the only thing embedded. A hit needs cosine >= ``threshold`` (strict by default, see
``DEFAULT_THRESHOLD``) and the second check (``verify.LexicalVerifier`` by default, with
``embedder``'s vectors of single words telling spelling variants apart); every
lookup reports its embedding, index and verify milliseconds.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from prefixcache.gateway.semantic.embedder import Embedder
from prefixcache.gateway.semantic.index import Entry, ScopedIndex
from prefixcache.gateway.semantic.redis_store import RedisEntryStore
from prefixcache.gateway.semantic.verify import LexicalVerifier, Verifier

# Strict: chosen on qqp_pairs with the second check (benchmarks/gateway/RESULTS.md),
# where the false-hit rate falls below 2% while precision stays flat from 0.88 up.
DEFAULT_THRESHOLD = 0.95
RECENT_VECTORS = 256  # texts whose vectors are kept between a lookup and its store


@dataclass(frozen=True)
class LookupTimings:
    """Milliseconds spent per stage of one lookup (0.0 for a stage that did not run)."""

    embed_ms: float = 0.0
    index_ms: float = 0.0
    verify_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        return self.embed_ms + self.index_ms + self.verify_ms


@dataclass(frozen=True)
class SemanticHit:
    """A served hit: the stored response ``value``, its cosine ``score`` and the cached text."""

    value: bytes
    score: float
    text: str
    timings: LookupTimings = field(default_factory=LookupTimings)


@dataclass(frozen=True)
class SemanticLookup:
    """Outcome of ``SemanticCache.search``: ``hit`` (None on a miss), why, and the timings.

    ``reason``: "hit", "empty_text", "empty_scope", "below_threshold" or
    "rejected:<check>" (the verifier's reason for the best candidate above threshold).
    ``best_score``: the best cosine seen (None when the scope had no live entry).
    """

    hit: SemanticHit | None
    reason: str
    best_score: float | None
    timings: LookupTimings


class SemanticCache:
    """Scope-partitioned semantic response cache.

    ``embedder``: text -> unit vectors; ``threshold``: cosine in (0, 1] (1.0: identical text
    only); ``verifier``: the second check; ``candidates``: neighbours examined per lookup;
    ``redis_url``: persist entries there and rebuild the index from it now; the remaining
    keywords bound the index (see ``index.ScopedIndex``). Raises ``ValueError`` naming the
    parameter for a bad threshold, candidates or bound.
    """

    def __init__(self, embedder: Embedder, threshold: float = DEFAULT_THRESHOLD,
                 verifier: Verifier | None = None, candidates: int = 4,
                 redis_url: str | None = None, ttl_s: float | None = 3600.0,
                 max_scopes: int = 10_000, max_entries_per_scope: int = 1_000,
                 max_entries: int = 100_000, max_bytes: int = 256 << 20,
                 max_value_bytes: int = 1 << 20) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        if candidates < 1:
            raise ValueError(f"candidates must be >= 1, got {candidates}")
        if max_value_bytes < 1:
            raise ValueError(f"max_value_bytes must be >= 1, got {max_value_bytes}")
        self.embedder = embedder
        self.threshold = threshold
        self.verifier: Verifier = (verifier if verifier is not None
                                   else LexicalVerifier(word_vectors=embedder))
        self.candidates = candidates
        self.max_value_bytes = max_value_bytes
        self.index = ScopedIndex(embedder.dim, max_scopes, max_entries_per_scope, max_entries,
                                 max_bytes, ttl_s)
        self.stats = {"hits": 0, "misses": 0, "rejected": 0, "stores": 0, "skipped": 0}
        self._lock = threading.Lock()
        # vectors of recent lookups: the store that follows a miss does not embed again
        self._recent: OrderedDict[str, np.ndarray] = OrderedDict()
        self.store_backend: RedisEntryStore | None = None
        if redis_url is not None:
            self.store_backend = RedisEntryStore(redis_url, embedder.dim, ttl_s=ttl_s)
            self._rebuild()

    def lookup(self, scope: bytes, text: str) -> SemanticHit | None:
        """The cached response for a request of ``scope`` whose last user turn is ``text``.

        Returns None on a miss. Raises ``ValueError`` when ``scope`` is not bytes or ``text``
        is not str.
        """
        return self.search(scope, text).hit

    def search(self, scope: bytes, text: str) -> SemanticLookup:
        """Like ``lookup``, with the reason and per-stage timings of a miss as well as a hit."""
        _check(scope, text)
        if not text.strip():
            self.stats["misses"] += 1
            return SemanticLookup(None, "empty_text", None, LookupTimings())
        t0 = time.perf_counter()
        vector = self._vector(text)
        t1 = time.perf_counter()
        with self._lock:
            found = self.index.search(scope, vector, text, self.candidates)
        t2 = time.perf_counter()
        hit, reason = None, "empty_scope" if not found else "below_threshold"
        for cand in found:
            if cand.score < self.threshold:
                break
            verdict = self.verifier.check(text, cand.entry.text)
            if verdict.ok:
                hit, reason = cand, "hit"
                break
            if not reason.startswith("rejected"):
                reason = f"rejected:{verdict.reason}"
        t3 = time.perf_counter()
        timings = LookupTimings((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        best = found[0].score if found else None
        if hit is None:
            self.stats["rejected" if reason.startswith("rejected") else "misses"] += 1
            return SemanticLookup(None, reason, best, timings)
        with self._lock:
            self.index.touch(scope, hit.entry.text)
        self.stats["hits"] += 1
        served = SemanticHit(hit.entry.value, hit.score, hit.entry.text, timings)
        return SemanticLookup(served, reason, best, timings)

    def store(self, scope: bytes, text: str, value: bytes) -> None:
        """Remember ``value`` (a complete, successful response) for ``text`` under ``scope``.

        Empty text and values over ``max_value_bytes`` are skipped (counted). Raises
        ``ValueError`` when ``scope`` or ``value`` is not bytes or ``text`` is not str.
        """
        _check(scope, text)
        if not isinstance(value, bytes):
            raise ValueError("value must be bytes")
        if not text.strip() or len(value) > self.max_value_bytes:
            self.stats["skipped"] += 1
            return
        entry = Entry(text, self._vector(text), value, time.time())
        with self._lock:
            stored = self.index.add(scope, entry)
        if not stored:
            self.stats["skipped"] += 1
            return
        self.stats["stores"] += 1
        if self.store_backend is not None:
            self.store_backend.put(scope, entry)

    def close(self) -> None:
        """Write out queued entries and release the Redis connection (if any)."""
        if self.store_backend is not None:
            self.store_backend.close()
            self.store_backend = None

    def _vector(self, text: str) -> np.ndarray:
        with self._lock:
            vector = self._recent.get(text)
            if vector is not None:
                self._recent.move_to_end(text)
                return vector
        vector = self.embedder.embed([text])[0].astype(np.float32)
        with self._lock:
            self._recent[text] = vector
            while len(self._recent) > RECENT_VECTORS:
                self._recent.popitem(last=False)
        return vector

    def _rebuild(self) -> None:
        assert self.store_backend is not None
        loaded = sorted(self.store_backend.load(), key=lambda se: se[1].created)
        with self._lock:
            for scope, entry in loaded:  # oldest first, so the LRU keeps the newest
                self.index.add(scope, entry)


def _check(scope: object, text: object) -> None:
    if not isinstance(scope, bytes):
        raise ValueError("scope must be bytes")
    if not isinstance(text, str):
        raise ValueError("text must be str")
