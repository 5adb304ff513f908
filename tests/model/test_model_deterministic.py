"""Deterministic mode: every token's KV and logits are bit-identical (``torch.equal``)
whatever the batch, the chunking, the cache state, and prefill versus decode."""
from __future__ import annotations

import random

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache.model import load_model

N = 100  # prompt tokens: 6 full pages and a partial one


@pytest.fixture(scope="module")
def tiny():
    return load_model("builtin:tiny").model


@pytest.fixture(scope="module")
def windowed(tmp_path_factory):
    return load_model(str(save_hf_model(make_hf_model("mistral_window"),
                                        tmp_path_factory.mktemp("mw")))).model


def prompt(n: int = N, seed: int = 0, vocab: int = 256) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def runner(model, seed: int) -> PagedRunner:
    return PagedRunner(model, num_pages=64, seed=seed, deterministic=True)


def kv_of(r: PagedRunner, seq: Seq) -> list[torch.Tensor]:
    """Per layer, K and V of the sequence's positions, ``[2, n, kv_heads, d]``."""
    table = torch.tensor(seq.pages)
    return [torch.stack(r.kv.gather(layer, table, seq.computed))
            for layer in range(len(r.kv.k))]


def assert_kv_equal(a: list[torch.Tensor], b: list[torch.Tensor], upto: int | None = None):
    for layer, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x[:, :upto], y[:, :upto]), f"layer {layer}"


@pytest.fixture(scope="module")
def reference(tiny):
    """Whole prompt in one step: all-position logits and KV."""
    r = runner(tiny, seed=1)
    seq = Seq()
    logits = r.prefill(seq, prompt(), all_logits=True)
    return logits, kv_of(r, seq)


@pytest.mark.parametrize("chunk", [24, 7])
def test_chunking_does_not_change_a_bit(tiny, reference, chunk):
    ref_logits, ref_kv = reference
    r = runner(tiny, seed=chunk)
    seq = Seq()
    logits = r.prefill(seq, prompt(), chunk=chunk, all_logits=True)
    assert torch.equal(logits, ref_logits)
    assert_kv_equal(kv_of(r, seq), ref_kv)


def test_warm_prefix_from_cache_is_bit_identical(tiny, reference):
    ref_logits, ref_kv = reference
    r = runner(tiny, seed=2)
    first = Seq()
    r.prefill(first, prompt()[:64])
    warm = r.fork(first, 64)  # the prefix comes from the cache: 4 shared pages
    logits = r.step([(warm, prompt()[64:])], all_logits=True)[0]
    assert torch.equal(logits, ref_logits[64:])
    assert_kv_equal(kv_of(r, warm), ref_kv)


def test_mixed_batch_does_not_change_a_bit(tiny, reference):
    ref_logits, ref_kv = reference
    r = runner(tiny, seed=3)
    other, decoding, target = Seq(), Seq(), Seq()
    r.prefill(decoding, prompt(21, seed=9))
    got = r.step([(other, prompt(37, seed=8)), (target, prompt()),
                  (decoding, [5])], all_logits=True)
    assert torch.equal(got[1], ref_logits)
    assert_kv_equal(kv_of(r, target), ref_kv)


def test_decode_equals_prefill_for_the_same_position(tiny, reference):
    ref_logits, ref_kv = reference
    r = runner(tiny, seed=4)
    seq = Seq()
    r.prefill(seq, prompt()[:40])
    rows = [r.step([(seq, [tok])])[0] for tok in prompt()[40:70]]  # one token per step
    assert torch.equal(torch.stack(rows), ref_logits[40:70])
    assert_kv_equal(kv_of(r, seq), ref_kv, upto=70)


def test_decoded_pages_serve_a_longer_prompt_bit_identically(tiny, reference):
    """A page filled during decode is later hit by a prompt that extends it."""
    ref_logits, _ = reference
    r = runner(tiny, seed=5)
    chat = Seq()
    r.prefill(chat, prompt()[:40])
    for tok in prompt()[40:64]:
        r.step([(chat, [tok])])
    next_turn = r.fork(chat, 64)
    logits = r.step([(next_turn, prompt()[64:])], all_logits=True)[0]
    assert torch.equal(logits, ref_logits[64:])


def test_stale_and_nan_page_contents_never_matter(tiny, reference):
    ref_logits, ref_kv = reference
    r = runner(tiny, seed=6)
    for t in r.kv.k + r.kv.v:
        t.fill_(float("nan"))
    seq = Seq()
    logits = r.prefill(seq, prompt(), chunk=24, all_logits=True)
    assert not logits.isnan().any()
    assert torch.equal(logits, ref_logits)
    assert_kv_equal(kv_of(r, seq), ref_kv)


def test_default_mode_also_ignores_stale_pages(tiny):
    clean = PagedRunner(tiny, num_pages=64, seed=7)
    dirty = PagedRunner(tiny, num_pages=64, seed=7)
    for t in dirty.kv.k + dirty.kv.v:
        t.fill_(float("nan"))
    a = clean.prefill(Seq(), prompt(), chunk=24, all_logits=True)
    b = dirty.prefill(Seq(), prompt(), chunk=24, all_logits=True)
    assert torch.equal(a, b)


def test_sliding_window_model_is_deterministic(windowed):
    ids = prompt(70, seed=3)
    a = runner(windowed, 1).prefill(Seq(), ids, all_logits=True)
    b = runner(windowed, 2).prefill(Seq(), ids, chunk=7, all_logits=True)
    assert torch.equal(a, b)
    # and still the right function: close to the default mode
    c = PagedRunner(windowed, seed=3).prefill(Seq(), ids, all_logits=True)
    torch.testing.assert_close(a, c, atol=1e-4, rtol=0)


def test_bfloat16_deterministic_across_chunking():
    model = load_model("builtin:tiny", dtype="bfloat16").model
    ids = prompt(50, seed=4)
    a = runner(model, 1).prefill(Seq(), ids, all_logits=True)
    b = runner(model, 2).prefill(Seq(), ids, chunk=9, all_logits=True)
    assert torch.equal(a, b)


def test_deterministic_matches_default_within_float_tolerance(tiny, reference):
    default = PagedRunner(tiny, seed=8).prefill(Seq(), prompt(), all_logits=True)
    torch.testing.assert_close(reference[0], default, atol=1e-4, rtol=0)
