"""The second check: near-misses are rejected for the right reason, paraphrases pass."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixcache.gateway.semantic.near_miss import NEAR_MISSES, PARAPHRASES
from prefixcache.gateway.semantic.verify import AcceptAll, LexicalVerifier

V = LexicalVerifier()
KIND_REASONS = {"entity": {"entities"}, "negation": {"negation", "opposites"},
                "number": {"numbers"}, "reversed": {"order", "opposites"}}


@pytest.mark.parametrize(("kind", "a", "b"), NEAR_MISSES)
def test_every_near_miss_is_rejected_for_its_kind(kind, a, b):
    for query, cached in ((b, a), (a, b)):
        verdict = V.check(query, cached)
        assert not verdict.ok
        assert verdict.reason in KIND_REASONS[kind]


def test_paraphrases_pass():
    assert [V.check(b, a).ok for a, b in PARAPHRASES] == [True] * len(PARAPHRASES)


@pytest.mark.parametrize(("a", "b", "reason"), [
    ("How do I check if a column is NULL?", "How do I check if a column is not NULL?",
     "negation"),
    ("Why is my phone charging?", "Why isn\u2019t my phone charging?", "negation"),
    ("What is 15% of 200?", "What is 15% of 300?", "numbers"),
    ("Can I bring two bags?", "Can I bring 2 bags?", ""),       # words and digits agree
    ("Is 1,000 enough?", "Is 1000 enough?", ""),
    ("Is 1,000 enough?", "Is 100 enough?", "numbers"),
    ("Is Python faster than Java?", "Is Java faster than Python?", "order"),
    ("Why did Rome defeat Carthage?", "Why did Carthage defeat Rome?", "order"),
    ("What is the refund window for EU orders?", "What is the refund window for US orders?",
     "entities"),
    ("Is Java good?", "Is JavaScript good?", "entities"),
    ("What does Japan think of China?", "What do Japanese people think about China?", ""),
    ("Should I buy Tesla stock?", "Should I sell Tesla stock?", "opposites"),
    ("How can I know whether or not I am a genius?", "How can I know if I am a genius?", ""),
])
def test_named_checks(a, b, reason):
    verdict = V.check(b, a)
    assert (verdict.ok, verdict.reason) == (reason == "", reason)


@given(st.text(max_size=60), st.text(max_size=60))
def test_never_raises_and_identical_text_passes(a, b):
    assert V.check(a, a).ok
    assert isinstance(V.check(a, b).ok, bool)
    assert AcceptAll().check(a, b).ok
