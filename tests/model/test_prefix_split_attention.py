"""A prefill chunk after a cached prefix: two flash calls merged by log-sum-exp equal
one masked SDPA call; the CPU backend's plan routes such chunks there on the CPU only."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.model.attention import causal_mask, plan_attention
from prefixcache.model.cpu.backend import (
    SPLIT_MIN_WORK,
    CpuKernelBackend,
    prefix_split_attention,
)
from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.kv_pool import KVPool

# the CPU backend without the C++ kernels: the split is its path for these chunks
CPU = CpuKernelBackend(torch.float32, kernels=False)
POOL = KVPool(1, 51, 16, 1, 8, torch.float32, "cpu")


def cpu_plan(chunks: list[SeqChunk], window: int | None, device: str = "cpu"):
    return CPU.plan_attention(chunks, window, POOL, 4, torch.device(device))


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kvh,prefix,n", [(9, 3, 700, 90), (4, 4, 1, 5), (8, 2, 33, 2)])
def test_split_equals_masked_sdpa(dtype, tol, heads, kvh, prefix, n):
    g = torch.Generator().manual_seed(prefix + n)
    d = 32
    q = torch.randn(n, heads, d, generator=g).to(dtype)
    k = torch.randn(prefix + n, kvh, d, generator=g).to(dtype)
    v = torch.randn(prefix + n, kvh, d, generator=g).to(dtype)
    got = prefix_split_attention(q, k[:prefix], v[:prefix], k[prefix:], v[prefix:])
    assert got.shape == (n, heads, d) and got.dtype == dtype
    s = SeqChunk(0, n, prefix + n, torch.arange(1))
    want = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0).float(), k.transpose(0, 1).unsqueeze(0).float(),
        v.transpose(0, 1).unsqueeze(0).float(), attn_mask=causal_mask(s, 0, None, q.device),
        enable_gqa=True)[0].transpose(0, 1)
    torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)


def test_plan_splits_cpu_chunks_after_a_prefix_only():
    chunks = [SeqChunk(0, 300, 600, torch.arange(38)),    # 300 new x 300 cached: split
              SeqChunk(300, 30, 30, torch.arange(38, 40)),  # from position 0: plain causal
              SeqChunk(330, 40, 100, torch.arange(40, 47)),  # 40 x 60: below SPLIT_MIN_WORK
              SeqChunk(370, 1, 50, torch.arange(47, 51))]   # decode
    assert 300 * 300 >= SPLIT_MIN_WORK > 40 * 60
    assert not any(p.split for p in plan_attention(chunks, None, torch.device("cpu"), 16).seqs)
    plan = cpu_plan(chunks, None)
    assert [(p.seq.q_start, p.split, p.causal, p.mask is None) for p in plan.seqs] == [
        (0, True, False, True), (300, False, True, True), (330, False, False, False)]
    windowed = cpu_plan(chunks[:1], 32).seqs[0]
    assert not windowed.split and windowed.mask is not None
    assert windowed.mask.shape == (300, 600 - (300 - 32 + 1))
    meta = cpu_plan(chunks[:1], None, "meta").seqs[0]
    assert not meta.split and meta.mask is not None  # other devices keep the masked call


def test_engine_prefill_after_a_prefix_takes_the_split_and_matches_transformers(monkeypatch):
    from tests.helpers.hf_models import hf_logits, make_hf_model
    from tests.helpers.paged import PagedRunner, Seq, paged_copy

    hf = make_hf_model("llama")
    m = paged_copy(hf)
    m.set_backend(CpuKernelBackend(torch.float32, prefill_kernel=False))  # no prefill kernel
    runner = PagedRunner(m, num_pages=64)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (520,), generator=g).tolist()
    seq = Seq()
    runner.prefill(seq, ids[:260])
    chunk = m.backend.plan_attention([SeqChunk(0, 260, 520, torch.arange(33))], None,
                                     runner.kv, m.config.num_attention_heads,
                                     torch.device("cpu")).seqs[0]
    assert chunk.split  # 260 new over 260 cached
    got = runner.step([(seq, ids[260:])])[0]
    torch.testing.assert_close(got, hf_logits(hf, ids)[-1], atol=2e-4, rtol=1e-4)
