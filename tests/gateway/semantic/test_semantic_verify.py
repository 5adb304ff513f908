"""The second check: near-misses are rejected for the right reason, paraphrases that keep
their words pass, and no word list decides it."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefixcache.gateway.semantic.near_miss import NEAR_MISSES, PARAPHRASES
from prefixcache.gateway.semantic.verify import AcceptAll, LexicalVerifier, tokens

V = LexicalVerifier()
KIND_REASONS = {"entity": {"words"}, "negation": {"words"},
                "number": {"numbers", "words"}, "reversed": {"order", "words"}}
# PARAPHRASES that keep every content word ("How do I" / "How can I", "isn't" / "is not")
PARAPHRASE_OK = [True, False, False, False, True, False, False, True, False, True,
                 True, False, True, False, True, False, False, True, False, False]


@pytest.mark.parametrize(("kind", "a", "b"), NEAR_MISSES)
def test_every_near_miss_is_rejected_for_its_kind(kind, a, b):
    for query, cached in ((b, a), (a, b)):
        verdict = V.check(query, cached)
        assert not verdict.ok
        assert verdict.reason in KIND_REASONS[kind]


def test_paraphrases_pass_only_with_the_same_content_words():
    assert [V.check(b, a).ok for a, b in PARAPHRASES] == PARAPHRASE_OK


@pytest.mark.parametrize(("a", "b", "reason"), [
    ("How long should I boil an egg for a soft yolk?",
     "How long should I boil an egg for a hard yolk?", "words"),
    ("How do I check if a column is NULL?", "How do I check if a column is not NULL?",
     "words"),
    ("Why is my phone charging?", "Why isn\u2019t my phone charging?", "words"),
    ("Why isn't my phone charging?", "Why is my phone not charging?", ""),  # "not" moves
    ("What is 15% of 200?", "What is 15% of 300?", "numbers"),
    ("Can I bring two bags?", "Can I bring 2 bags?", ""),       # words and digits agree
    ("Is 1,000 enough?", "Is 1000 enough?", ""),
    ("Is 1,000 enough?", "Is 100 enough?", "numbers"),
    ("Is 2.50 enough?", "Is 2.5 enough?", ""),
    ("Is Python faster than Java?", "Is Java faster than Python?", "order"),
    ("Why did Rome defeat Carthage?", "Why did Carthage defeat Rome?", "order"),
    ("What is the refund window for EU orders?", "What is the refund window for US orders?",
     "words"),
    ("Is Java good?", "Is JavaScript good?", "words"),
    ("What was the inflation rate?", "What is the inflation rate?", "words"),  # tense
    ("Should I buy Tesla stock?", "Should I sell Tesla stock?", "words"),
    ("How do I set up e-mail?", "How can I set up email?", ""),
    ("What's the return policy?", "What is the return policy?", ""),
])
def test_named_checks(a, b, reason):
    verdict = V.check(b, a)
    assert (verdict.ok, verdict.reason) == (reason == "", reason)


def test_tokens_are_normalised():
    assert tokens("Why isn\u2019t my E-mail 1,000.50 or 007? It's 15% of $20!") == [
        "why", "is", "not", "my", "email", "1000.5", "or", "7", "it", "15", "%", "of",
        "$", "20"]  # "'s" is dropped: "what's" / "what is" agree ("is" is grammar)
    assert tokens("Can't, won't, cannot") == ["can", "not", "will", "not", "can", "not"]


class WordVectors:
    """Fixed unit vectors for a few words (cosine given by the table)."""

    dim = 2
    ANGLE = {"colour": 0.0, "color": 0.1, "charge": 1.0, "charging": 1.2, "weekday": 2.0,
             "weekend": 2.05, "heated": 3.0, "unheated": 3.01}

    def embed(self, texts):
        return np.array([[np.cos(self.ANGLE.get(t, 5.0 + len(t))),
                          np.sin(self.ANGLE.get(t, 5.0 + len(t)))] for t in texts],
                        dtype=np.float32)


def test_word_variants_need_a_shared_prefix_and_close_vectors():
    v = LexicalVerifier(word_vectors=WordVectors())
    assert v.check("What colour is it?", "What color is it?").ok        # cos 0.995
    assert not V.check("What colour is it?", "What color is it?").ok     # no vectors
    assert v.check("Why is it charging?", "Why is it charge?").ok        # cos 0.98
    assert v.check("Is it a weekday?", "Is it a weekend?").reason == "words"  # 4 of 7
    assert v.check("Is it heated?", "Is it unheated?").reason == "words"  # no prefix
    assert v.check("Is it hot?", "Is it cold?").reason == "words"
    assert v.check("colour colour", "colour color").ok
    assert v.check("color color", "colour charge").reason == "words"


@given(st.text(max_size=60), st.text(max_size=60))
def test_never_raises_and_identical_text_passes(a, b):
    assert V.check(a, a).ok
    assert isinstance(V.check(a, b).ok, bool)
    assert AcceptAll().check(a, b).ok
