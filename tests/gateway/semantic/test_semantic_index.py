"""Scope-partitioned index: bounds hold after every operation, TTL, replacement, isolation."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.gateway.semantic.index import Entry, ScopedIndex

DIM = 8


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    return v


def entry(text: str, i: int, value: bytes = b"v", created: float = 0.0) -> Entry:
    return Entry(text, unit(i), value, created)


def check_invariants(idx: ScopedIndex) -> None:
    entries = [e for s in idx.scopes.values() for e in s.entries.values()]
    assert idx.num_entries == len(entries) == sum(len(s.index) for s in idx.scopes.values())
    assert idx.nbytes == sum(e.nbytes for e in entries)
    assert idx.num_entries <= idx.max_entries
    assert idx.nbytes <= idx.max_bytes
    assert len(idx.scopes) <= idx.max_scopes
    for s in idx.scopes.values():
        assert 0 < len(s.entries) <= idx.max_entries_per_scope
        assert {s.by_text[e.text] for e in s.entries.values()} == set(s.entries)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]),
                          st.sampled_from(["x", "y", "z", "w", "v"]),
                          st.integers(0, 40), st.booleans()), max_size=60))
def test_bounds_hold_after_every_operation(ops):
    now = [0.0]
    idx = ScopedIndex(DIM, max_scopes=3, max_entries_per_scope=3, max_entries=5,
                      max_bytes=5 * (DIM * 4 + 1 + 20), ttl_s=10.0, clock=lambda: now[0])
    for scope, text, size, is_search in ops:
        now[0] += 1.0
        if is_search:
            for cand in idx.search(scope, unit(size), text):
                assert now[0] - cand.entry.created < 10.0
        else:
            assert idx.add(scope, entry(text, size, b"v" * size, now[0]))
        check_invariants(idx)


def test_lru_over_entries_and_scopes():
    idx = ScopedIndex(DIM, max_scopes=2, max_entries_per_scope=2, ttl_s=None)
    idx.add(b"s1", entry("a", 0))
    idx.add(b"s1", entry("b", 1))
    idx.search(b"s1", unit(0), "a")           # a search alone does not refresh an entry
    idx.touch(b"s1", "a")                     # serving it does: b is now the LRU
    idx.add(b"s1", entry("c", 2))             # evicts b, the least recently used
    assert sorted(e.text for e in idx.scopes[b"s1"].entries.values()) == ["a", "c"]
    idx.add(b"s2", entry("d", 3))
    idx.add(b"s3", entry("e", 4))             # evicts scope s1 (LRU over scopes)
    assert list(idx.scopes) == [b"s2", b"s3"]
    assert len(idx) == 2 and idx.evictions == 3


def test_same_text_replaces_and_search_stays_in_scope():
    idx = ScopedIndex(DIM, ttl_s=None)
    idx.add(b"A", entry("q", 0, b"old"))
    idx.add(b"A", entry("q", 0, b"new"))
    assert len(idx) == 1
    assert [c.entry.value for c in idx.search(b"A", unit(0), "q")] == [b"new"]
    assert idx.search(b"B", unit(0), "q") == []
    assert idx.search(b"A", unit(0), "q")[0].score == 1.0
    assert idx.search(b"A", unit(0), "other text")[0].score < 1.0  # 1.0 is identical text


def test_ttl_expires_and_removes():
    now = [100.0]
    idx = ScopedIndex(DIM, ttl_s=5.0, clock=lambda: now[0])
    idx.add(b"A", entry("q", 0, created=100.0))
    now[0] = 104.9
    assert len(idx.search(b"A", unit(0), "q")) == 1
    now[0] = 105.0
    assert idx.search(b"A", unit(0), "q") == []
    assert len(idx) == 0 and idx.scopes == {} and idx.expirations == 1
    assert not idx.add(b"A", entry("old", 0, created=99.0))  # already expired: not stored


def test_rejects_oversized_and_bad_vectors_and_bad_bounds():
    idx = ScopedIndex(DIM, max_bytes=100, ttl_s=None)
    assert not idx.add(b"A", entry("q", 0, b"x" * 100))
    assert not idx.add(b"A", Entry("q", np.ones(DIM + 1, np.float32), b"", 0.0))
    assert len(idx) == 0
    for kw in ("max_scopes", "max_entries_per_scope", "max_entries", "max_bytes"):
        with pytest.raises(ValueError, match=kw):
            ScopedIndex(DIM, **{kw: 0})
    with pytest.raises(ValueError, match="ttl_s"):
        ScopedIndex(DIM, ttl_s=0.0)
