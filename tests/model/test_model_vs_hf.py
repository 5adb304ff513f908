"""PagedLlama against Hugging Face transformers on small random checkpoints.

Every model is saved with ``save_pretrained`` and loaded through ``load_model``; pages come
from a shuffled free list, so page tables are never contiguous. float32 tolerance: logits
within ATOL of transformers' (observed differences are ~1e-6 or exactly 0).
"""
from __future__ import annotations

import random

import pytest
import torch

from helpers.hf_models import KINDS, hf_greedy, hf_logits, make_hf_model, save_hf_model
from helpers.paged import PagedRunner, Seq
from prefixcache.model import load_model

ATOL = 1e-4
PROMPT_LEN = 53  # 3 full pages and a partial one at block_size 16


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (HF model, our LoadedModel)."""
    out = {}
    for kind in KINDS:
        hf = make_hf_model(kind)
        path = save_hf_model(hf, tmp_path_factory.mktemp(kind))
        out[kind] = (hf, load_model(str(path)))
    return out


def prompt(n: int = PROMPT_LEN, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


@pytest.mark.parametrize("kind", list(KINDS))
def test_prefill_logits_and_greedy_match_transformers(models, kind):
    hf, ours = models[kind]
    ids = prompt()
    ref = hf_logits(hf, ids)
    runner = PagedRunner(ours.model, seed=7)
    seq = Seq()
    got = runner.prefill(seq, ids, all_logits=True)
    assert got.shape == ref.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)
    tokens = runner.greedy(seq, got[-1], 8)
    assert tokens == hf_greedy(hf, ids, 8)
    # pages really were scattered
    assert seq.pages != sorted(seq.pages)


@pytest.mark.parametrize("kind", ["llama", "llama3_tied", "qwen2", "mistral_window"])
def test_chunked_prefill_inside_pages_matches(models, kind):
    hf, ours = models[kind]
    ids = prompt(70, seed=1)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(ours.model, block_size=16, seed=3)
    got = runner.prefill(Seq(), ids, chunk=24, all_logits=True)  # boundaries at 24, 48
    torch.testing.assert_close(got, ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_prefix_reuse_from_shared_pages_matches(models, kind):
    hf, ours = models[kind]
    ids = prompt(61, seed=2)
    ref = hf_logits(hf, ids)
    runner = PagedRunner(ours.model, seed=4)
    first = Seq()
    runner.prefill(first, ids[:32])
    second = runner.fork(first, 32)  # a new request hitting the first two pages
    got = runner.step([(second, ids[32:])], all_logits=True)[0]
    torch.testing.assert_close(got, ref[32:], atol=ATOL, rtol=0)
    assert second.pages[:2] == first.pages[:2]


def test_mixed_batch_of_prefill_chunk_and_decode_matches(models):
    hf, ours = models["llama"]
    a, b, c = prompt(40, 10), prompt(45, 11), prompt(19, 12)
    runner = PagedRunner(ours.model, seed=5)
    sa, sb, sc = Seq(), Seq(), Seq()
    runner.prefill(sb, b[:30])
    runner.prefill(sc, c[:18])
    # one step: a cold 40-token prefill, b's last 15 tokens over 30 cached, c's decode token
    la, lb, lc = runner.step([(sa, a), (sb, b[30:]), (sc, c[18:])], all_logits=True)
    torch.testing.assert_close(la, hf_logits(hf, a), atol=ATOL, rtol=0)
    torch.testing.assert_close(lb, hf_logits(hf, b)[30:], atol=ATOL, rtol=0)
    torch.testing.assert_close(lc, hf_logits(hf, c)[18:], atol=ATOL, rtol=0)


def test_sliding_window_is_exact_in_decode(models):
    """Decode well past an 8-token window: the masked keys stay in the pool, unused."""
    hf, ours = models["mistral_window"]
    assert ours.config.sliding_window == 8
    ids = prompt(30, seed=6)
    runner = PagedRunner(ours.model, seed=6)
    seq = Seq()
    got = runner.greedy(seq, runner.prefill(seq, ids), 10)
    assert got == hf_greedy(hf, ids, 10)


def test_sharded_checkpoint_loads_identically(models, tmp_path):
    hf, ours = models["llama"]
    path = save_hf_model(hf, tmp_path / "sharded", max_shard_size="40KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    sharded = load_model(str(path))
    for (name, a), (_, b) in zip(ours.model.named_parameters(),
                                 sharded.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("kind,dtype", [("llama", "bfloat16"), ("qwen2", "bfloat16"),
                                        ("llama3_tied", "float16"), ("qwen3", "bfloat16"),
                                        ("gemma3", "bfloat16"), ("phi4_mini", "bfloat16")])
def test_half_precision_follows_float32(models, tmp_path, kind, dtype):
    hf, ours32 = models[kind]
    path = save_hf_model(hf, tmp_path / kind)
    ours16 = load_model(str(path), dtype=dtype)
    assert ours16.model.embed.dtype == getattr(torch, dtype)
    ids = prompt(40, seed=8)
    r32, r16 = PagedRunner(ours32.model, seed=1), PagedRunner(ours16.model, seed=2)
    s32, s16 = Seq(), Seq()
    l32 = r32.prefill(s32, ids, all_logits=True)
    l16 = r16.prefill(s16, ids, all_logits=True)
    assert l16.dtype == torch.float32
    assert r16.kv.k[0].dtype == getattr(torch, dtype)
    # bf16 keeps ~3 significant digits (fp16 ~4); logits here are O(1)
    torch.testing.assert_close(l16, l32, atol=0.15, rtol=0.05)
    # decode 4 steps, both fed the float32 choice (so a near-tie cannot fork the paths)
    rows32, rows16 = [l32], [l16]
    for _ in range(4):
        tok = int(rows32[-1][-1].argmax())
        rows32.append(r32.step([(s32, [tok])], all_logits=True)[0])
        rows16.append(r16.step([(s16, [tok])], all_logits=True)[0])
    l32, l16 = torch.cat(rows32), torch.cat(rows16)
    torch.testing.assert_close(l16, l32, atol=0.15, rtol=0.05)
    # the same top token wherever float32 has a clear one (near-ties may swap)
    top2 = l32.topk(2).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1
    assert clear.sum() >= 20
    assert torch.equal(l16.argmax(-1)[clear], l32.argmax(-1)[clear])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_transformers_and_stays_deterministic(models, tmp_path):
    hf, _ = models["llama3_tied"]
    ours = load_model(str(save_hf_model(hf, tmp_path / "m")), device="cuda")
    assert ours.model.embed.is_cuda
    ids = prompt(70, seed=9)
    got = PagedRunner(ours.model, seed=1).prefill(Seq(), ids, chunk=24, all_logits=True)
    assert got.is_cuda
    torch.testing.assert_close(got.cpu(), hf_logits(hf, ids), atol=1e-3, rtol=0)
    det = [PagedRunner(ours.model, seed=s, deterministic=True).prefill(
        Seq(), ids, chunk=c, all_logits=True) for s, c in ((2, None), (3, 7))]
    assert torch.equal(det[0], det[1])


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral_window"])
def test_batched_decode_of_unequal_sequences_matches(models, kind):
    """Decode rows of sequences with different page counts share one padded SDPA call
    (a prefill chunk rides along); each row's logits equal transformers' at its position."""
    hf, ours = models[kind]
    lens = [5, 17, 40, 33]  # 1, 2, 3 and 3 pages: padding with masked keys
    ids = [prompt(n + 1, seed=20 + i) for i, n in enumerate(lens)]
    cold = prompt(21, seed=30)
    runner = PagedRunner(ours.model, seed=8)
    seqs = [Seq() for _ in lens]
    for s, x, n in zip(seqs, ids, lens):
        runner.prefill(s, x[:n])
    cold_seq = Seq()
    out = runner.step([(s, x[n:]) for s, x, n in zip(seqs, ids, lens)] + [(cold_seq, cold)],
                      all_logits=True)
    for got, x, n in zip(out, ids, lens):
        torch.testing.assert_close(got, hf_logits(hf, x)[n:], atol=ATOL, rtol=0)
    torch.testing.assert_close(out[-1], hf_logits(hf, cold), atol=ATOL, rtol=0)
