"""SemanticCache with a toy embedder: scope isolation, threshold 1.0, timings, bad input."""
from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.gateway.semantic.cache import SemanticCache
from prefixcache.gateway.semantic.verify import AcceptAll, Verdict
from tests.gateway.semantic.toy_embedder import ToyEmbedder


def scope(tenant: str, system: str = "You are helpful.", history: str = "") -> bytes:
    """What the gateway passes: a hash of the exact scope minus the last user turn."""
    return hashlib.blake2b(f"{tenant}\0{system}\0{history}".encode(), digest_size=16).digest()


def test_hit_in_scope_only(toy):
    cache = SemanticCache(toy, threshold=0.8)
    a = scope("tenant-a")
    cache.store(a, "how do i reset my password", b"answer-A")
    hit = cache.lookup(a, "how do i reset my password please")
    assert hit is not None and hit.value == b"answer-A"
    assert 0.8 <= hit.score < 1.0 and hit.text == "how do i reset my password"
    # another tenant, another system prompt, another history: never A's entry
    for other in (scope("tenant-b"), scope("tenant-a", "You are terse."),
                  scope("tenant-a", history="user: hi")):
        assert cache.lookup(other, "how do i reset my password") is None
        assert cache.search(other, "how do i reset my password").reason == "empty_scope"
    assert cache.stats == {"hits": 1, "misses": 6, "rejected": 0, "stores": 1, "skipped": 0}


def test_below_threshold_and_timings(toy):
    cache = SemanticCache(toy, threshold=0.95)
    s = scope("t")
    cache.store(s, "how do i reset my password", b"x")
    res = cache.search(s, "how do i reset my password please")
    assert res.hit is None and res.reason == "below_threshold"
    assert res.best_score is not None and res.best_score < 0.95
    assert res.timings.embed_ms > 0 and res.timings.index_ms > 0
    assert res.timings.total_ms >= res.timings.embed_ms
    hit = cache.lookup(s, "how do i reset my password")
    assert hit is not None and hit.score == 1.0 and hit.timings.verify_ms >= 0


def test_verifier_rejection_is_reported(toy):
    cache = SemanticCache(toy, threshold=0.5)
    s = scope("t")
    cache.store(s, "is the column null", b"x")
    res = cache.search(s, "is the column not null")
    assert res.hit is None and res.reason == "rejected:words"
    assert cache.stats["rejected"] == 1


def test_second_candidate_served_when_first_is_rejected(toy):
    class RejectFirst:
        def check(self, query, cached):
            return Verdict(cached != "a b c d", "test")

    cache = SemanticCache(toy, threshold=0.5, verifier=RejectFirst())
    s = scope("t")
    cache.store(s, "a b c d", b"first")
    cache.store(s, "a b c e", b"second")
    hit = cache.lookup(s, "a b c d")
    assert hit is not None and hit.value == b"second"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=6),
       st.text(min_size=1, max_size=20))
def test_threshold_one_serves_identical_text_only(stored, query):
    cache = SemanticCache(ToyEmbedder(), threshold=1.0, verifier=AcceptAll())
    s = scope("t")
    for i, text in enumerate(stored):
        cache.store(s, text, str(i).encode())
    hit = cache.lookup(s, query)
    live = [t for t in stored if t.strip()]
    if query.strip() and query in live:
        assert hit is not None and hit.text == query
        assert hit.value == str(max(i for i, t in enumerate(stored) if t == query)).encode()
    else:
        assert hit is None


def test_skips_and_bad_input(toy):
    cache = SemanticCache(toy, max_value_bytes=4)
    s = scope("t")
    cache.store(s, "   ", b"x")
    cache.store(s, "hello", b"12345")
    assert cache.stats["skipped"] == 2 and len(cache.index) == 0
    assert cache.search(s, " ").reason == "empty_text"
    for call, match in ((lambda: cache.lookup("s", "x"), "scope"),       # type: ignore[arg-type]
                        (lambda: cache.lookup(s, b"x"), "text"),         # type: ignore[arg-type]
                        (lambda: cache.store(s, "x", "v"), "value")):    # type: ignore[arg-type]
        with pytest.raises(ValueError, match=match):
            call()
    for kw, val in (("threshold", 0.0), ("threshold", 1.01), ("candidates", 0),
                    ("max_value_bytes", 0)):
        with pytest.raises(ValueError, match=kw):
            SemanticCache(toy, **{kw: val})


def test_memory_stays_bounded(toy):
    cache = SemanticCache(toy, max_scopes=4, max_entries_per_scope=8, max_entries=20,
                          max_bytes=20 * (64 * 4 + 40), ttl_s=None)
    for i in range(300):
        cache.store(scope(f"tenant-{i % 7}"), f"question number {i} about topic {i % 13}",
                    b"v" * (i % 30))
        assert len(cache.index) <= 20 and cache.index.nbytes <= 20 * (64 * 4 + 40)
        assert len(cache.index.scopes) <= 4
    assert cache.stats["stores"] == 300 and cache.index.evictions == 300 - len(cache.index)


def test_store_after_a_miss_does_not_embed_again(toy):
    cache = SemanticCache(toy, threshold=0.8)
    s = scope("t")
    assert cache.lookup(s, "how do i reset my password") is None
    cache.store(s, "how do i reset my password", b"x")
    assert toy.calls == 1
    assert cache.lookup(s, "how do i reset my password") is not None
    cache.store(s, "a new question", b"y")
    assert toy.calls == 2
