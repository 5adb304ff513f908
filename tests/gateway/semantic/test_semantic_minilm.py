"""The real embedder (all-MiniLM-L6-v2) through the cache at the default threshold."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from prefixcache.gateway.semantic.cache import DEFAULT_THRESHOLD, SemanticCache
from prefixcache.gateway.semantic.near_miss import NEAR_MISSES, PARAPHRASES
from prefixcache.gateway.semantic.verify import AcceptAll

# PARAPHRASES served at the default threshold (0.95) with the second check: the others
# score under 0.95 or use other words (the check knows no synonyms)
PARAPHRASE_HITS = [True, False, False, False, True, False, False, True, False, True,
                   True, False, True, False, True, False, False, True, False, False]
HELD_OUT = Path(__file__).parent / "data" / "held_out_pairs.tsv"


def test_embeddings_are_unit_rows_and_batch_independent(minilm):
    texts = ["What is the refund window for EU orders?",
             "What is the refund window for US orders?", "a", "x " * 400]
    vecs = minilm.embed(texts)
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    alone = np.stack([minilm.embed([t])[0] for t in texts])
    np.testing.assert_allclose(alone, vecs, atol=1e-5)   # padding does not change a vector
    assert float(vecs[0] @ vecs[1]) == pytest.approx(0.863, abs=0.002)  # NOTES.md's figure
    assert minilm.embed([]).shape == (0, 384)
    with pytest.raises(ValueError, match="texts"):
        minilm.embed("not a list")


def _served(cache: SemanticCache, pairs, tag: str) -> list[bool]:
    out = []
    for i, (a, b) in enumerate(pairs):
        scope = f"{tag}-{i}".encode()
        cache.store(scope, a, a.encode())
        hit = cache.lookup(scope, b)
        assert hit is None or hit.value == a.encode()
        out.append(hit is not None)
    return out


def test_default_threshold_paraphrases_and_near_misses(minilm):
    cache = SemanticCache(minilm)
    assert cache.threshold == DEFAULT_THRESHOLD == 0.95
    assert _served(cache, PARAPHRASES, "p") == PARAPHRASE_HITS
    assert sum(_served(cache, [(a, b) for _, a, b in NEAR_MISSES], "n")) == 0
    # without the second check the same threshold serves many near-misses
    raw = SemanticCache(minilm, verifier=AcceptAll())
    leaked = _served(raw, [(a, b) for _, a, b in NEAR_MISSES], "n")
    assert sum(leaked) >= 20


def test_paraphrase_never_crosses_tenants_or_system_prompts(minilm):
    cache = SemanticCache(minilm)
    a, b, other_prompt = b"tenant-a|sys1", b"tenant-b|sys1", b"tenant-a|sys2"
    cache.store(a, "How do I cancel my subscription?", b"A's answer")
    hit = cache.lookup(a, "How can I cancel my subscription?")
    assert hit is not None and hit.value == b"A's answer" and hit.score >= 0.95
    assert hit.timings.embed_ms > 0
    for scope in (b, other_prompt):
        assert cache.lookup(scope, "How can I cancel my subscription?") is None
        assert cache.lookup(scope, "How do I cancel my subscription?") is None


def test_an_antonym_is_not_served(minilm):
    cache = SemanticCache(minilm)
    cache.store(b"s", "How long should I boil an egg for a soft yolk?", b"soft")
    found = cache.search(b"s", "How long should I boil an egg for a hard yolk?")
    assert found.best_score is not None and found.best_score >= DEFAULT_THRESHOLD
    assert found.hit is None and found.reason == "rejected:words"


def test_held_out_near_misses_get_no_false_hit_at_the_default_threshold(minilm):
    """The held-out file (written after the check was fixed; figures and the command in
    benchmarks/gateway/RESULTS.md): 0 of 90 near-misses served, 17 of 30 paraphrases,
    where the threshold alone serves 33 near-misses."""
    rows = [line.split("\t") for line in HELD_OUT.read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    near = [(a, b) for kind, a, b in rows if kind != "paraphrase"]
    para = [(a, b) for kind, a, b in rows if kind == "paraphrase"]
    assert (len(near), len(para)) == (90, 30)
    assert sum(_served(SemanticCache(minilm), near, "h")) == 0
    assert sum(_served(SemanticCache(minilm), para, "hp")) == 17
    assert sum(_served(SemanticCache(minilm, verifier=AcceptAll()), near, "hr")) == 33
