"""The in-place paged prefill kernel against float64 causal softmax attention: cold and
after a prefix, ragged pages, every grouped-query layout it takes, both pool dtypes; its
refusals; the plan that routes chunks to it; and engine steps with and without it against
transformers."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.model.attention import plan_attention
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import paged_prefill as kernel
from prefixcache.model.forward_batch import SeqChunk
from tests.helpers.hf_models import hf_logits, make_hf_model
from tests.helpers.kernels import built_or_skip
from tests.helpers.paged import PagedRunner, Seq, paged_copy


@pytest.fixture(scope="module")
def built():
    return built_or_skip(kernel, "prefill")


def reference(q, k, v, first):
    """float64 causal attention of queries ``q [n, heads, d]`` at positions
    ``[first, first + n)`` over keys ``k, v [first + n, kv_heads, d]``."""
    n, heads, d = q.shape
    group = heads // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    s = torch.einsum("thd,jhd->htj", q.double(), k) * d ** -0.5
    hidden = torch.arange(k.shape[0])[None, :] > torch.arange(first, first + n)[:, None]
    s = s.masked_fill(hidden, float("-inf"))
    return torch.einsum("htj,jhd->thd", s.softmax(-1), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh,d,bs", [(9, 3, 64, 16), (4, 4, 32, 8), (16, 2, 128, 32),
                                            (7, 7, 8, 5), (48, 1, 16, 16), (10, 2, 16, 16),
                                            (32, 1, 8, 4)])  # groups 5 and 32: padded lanes
@pytest.mark.parametrize("n,first", [(1, 0), (2, 0), (37, 0), (130, 0), (5, 70), (64, 3),
                                     (100, 517)])
def test_kernel_matches_causal_softmax_attention(built, dtype, heads, kvh, d, bs, n, first):
    g = torch.Generator().manual_seed(heads * 1000 + d * 10 + bs + n + first)
    ctx = first + n
    pages = -(-ctx // bs)
    pool = pages + 6
    k_pool = torch.randn(pool, bs, kvh, d, generator=g).to(dtype)
    v_pool = torch.randn(pool, bs, kvh, d, generator=g).to(dtype)
    table = torch.randperm(pool, generator=g)[:pages + 1]      # scattered, one page spare
    q = torch.randn(n, heads, d, generator=g).to(dtype)
    k0, v0 = k_pool.clone(), v_pool.clone()
    got = built.paged_prefill(q, k_pool, v_pool, table, first, d ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(k_pool, k0) and torch.equal(v_pool, v0)  # pages are only read
    k = k_pool[table].flatten(0, 1)[:ctx].float()
    v = v_pool[table].flatten(0, 1)[:ctx].float()
    want = reference(q.float(), k, v, first)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("heads,kvh", [(8, 4), (8, 8), (9, 3)])
def test_kernel_is_exact_on_peaked_scores(built, heads, kvh):
    """Scores hundreds apart (queries scaled by 60): most exps fall below the kernel's
    floor (e^-86, where it stops short of denormals) and the softmax is nearly one-hot;
    the result stays as close to float64 attention as torch's float32 SDPA is (scores of
    that size carry float32 rounding of about 1e-5), on the masked diagonal blocks too."""
    g = torch.Generator().manual_seed(heads + kvh)
    n, first, d, bs = 150, 70, 64, 16
    ctx = first + n
    pages = -(-ctx // bs)
    k_pool = torch.randn(pages + 2, bs, kvh, d, generator=g)
    v_pool = torch.randn(pages + 2, bs, kvh, d, generator=g)
    table = torch.randperm(pages + 2, generator=g)[:pages]
    q = torch.randn(n, heads, d, generator=g) * 60
    got = built.paged_prefill(q, k_pool, v_pool, table, first, d ** -0.5)
    k = k_pool[table].flatten(0, 1)[:ctx]
    v = v_pool[table].flatten(0, 1)[:ctx]
    want = reference(q, k, v, first)
    s = torch.einsum("thd,jhd->htj", q.double(), k.double().repeat_interleave(
        heads // kvh, dim=1)) * d ** -0.5
    hidden = torch.arange(ctx)[None, :] > torch.arange(first, ctx)[:, None]
    below = ((s - s.amax(-1, keepdim=True)) < -86) & ~hidden
    assert below.sum() > 0.5 * (~hidden).sum() * heads  # the case reaches the floor
    group = heads // kvh
    sdpa = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.repeat_interleave(group, 1).transpose(0, 1),
        v.repeat_interleave(group, 1).transpose(0, 1), attn_mask=~hidden).transpose(0, 1)
    torch_err = (sdpa.double() - want).abs().max().item()
    assert 0 < torch_err < 1e-4
    assert (got.double() - want).abs().max().item() <= 1.5 * torch_err


def test_kernel_reads_strided_queries_and_writes_into_out(built):
    """q a slice of a fused q/k tensor and out rows of a step's output: read and written in
    place, the rows around them untouched; a bfloat16 out is filled through a copy."""
    g = torch.Generator().manual_seed(7)
    k_pool, v_pool = torch.randn(2, 6, 16, 3, 64, generator=g)
    table = torch.tensor([4, 1, 3])
    qk = torch.randn(40, 12, 64, generator=g)                 # 9 query heads, then 3 keys
    q = qk[:, :9]
    assert not q.is_contiguous()
    step_out = torch.full((50, 9, 64), 7.0)
    got = built.paged_prefill(q, k_pool, v_pool, table, 5, 0.125, out=step_out[10:50])
    assert got.data_ptr() == step_out[10].data_ptr()
    want = built.paged_prefill(q.contiguous(), k_pool, v_pool, table, 5, 0.125)
    assert torch.equal(step_out[10:50], want)
    assert torch.equal(step_out[:10], torch.full((10, 9, 64), 7.0))
    half = torch.zeros(40, 9, 64, dtype=torch.bfloat16)
    built.paged_prefill(q.bfloat16(), k_pool, v_pool, table, 5, 0.125, out=half)
    torch.testing.assert_close(half.float(), want, atol=2e-2, rtol=2e-2)


def test_kernel_rejects_bad_tables_and_geometry(built):
    k = torch.zeros(4, 16, 1, 8)
    q = torch.zeros(3, 1, 8)
    with pytest.raises(RuntimeError, match="page id outside the pool"):
        built.paged_prefill(q, k, k, torch.tensor([4]), 0, 1.0)
    with pytest.raises(RuntimeError, match="beyond its page table"):
        built.paged_prefill(q, k, k, torch.tensor([0]), 14, 1.0)   # keys 14..16 of 16
    with pytest.raises(RuntimeError, match="beyond its page table"):
        built.paged_prefill(q, k, k, torch.tensor([0]), -1, 1.0)
    with pytest.raises(RuntimeError, match="beyond its page table"):  # no int overflow
        built.paged_prefill(q, k, k, torch.tensor([0]), 2**63 - 2, 1.0)
    with pytest.raises(RuntimeError, match="unsupported geometry"):
        built.paged_prefill(torch.zeros(3, 1, 12), torch.zeros(4, 16, 1, 12),
                            torch.zeros(4, 16, 1, 12), torch.tensor([0]), 0, 1.0)
    with pytest.raises(RuntimeError, match="unsupported geometry"):  # no division by zero
        built.paged_prefill(torch.zeros(3, 0, 8), k, k, torch.tensor([0]), 0, 1.0)
    empty = torch.zeros(0, 1, 8)
    assert built.paged_prefill(empty, k, k, torch.tensor([0]), 0, 1.0).shape == (0, 1, 8)


def test_supports_names_what_it_cannot_do():
    assert kernel.supports(torch.zeros(2, 16, 3, 64), 9)
    assert kernel.supports(torch.zeros(2, 16, 3, 64, dtype=torch.bfloat16), 9)
    assert not kernel.supports(torch.zeros(2, 16, 3, 64, dtype=torch.float16), 9)
    assert not kernel.supports(torch.zeros(2, 16, 3, 60), 9)      # head_dim not a multiple of 8
    assert not kernel.supports(torch.zeros(2, 16, 1, 64), 64)     # 64 heads per KV head
    assert not kernel.supports(torch.zeros(2, 16, 3, 64, device="meta"), 9)


def test_plan_routes_multi_token_chunks_without_a_window_to_the_kernel():
    chunks = [SeqChunk(0, 300, 600, torch.arange(38)),     # after a prefix
              SeqChunk(300, 30, 30, torch.arange(38, 40)),  # cold
              SeqChunk(330, 1, 1, torch.arange(40, 41)),    # a one-token prompt
              SeqChunk(331, 1, 50, torch.arange(41, 45))]   # decode
    plan = plan_attention(chunks, None, torch.device("cpu"), 16, prefill_in_place=True)
    assert [(p.seq.q_start, p.in_place, p.mask is None) for p in plan.seqs] == [
        (0, True, True), (300, True, True), (330, False, True)]
    assert [g.rows.tolist() for g in plan.decode] == [[331]]
    windowed = plan_attention(chunks[:2], 32, torch.device("cpu"), 16, prefill_in_place=True)
    assert [p.in_place for p in windowed.seqs] == [False, False]  # windows stay on SDPA
    off = plan_attention(chunks[:2], None, torch.device("cpu"), 16)
    assert [p.in_place for p in off.seqs] == [False, False]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_engine_prefill_in_place_equals_sdpa_and_transformers(built, kind, monkeypatch):
    """Cold prompts, chunked prefill and a chunk after a cached prefix (a forked
    sequence), with the kernel and with SDPA: all match transformers, and with the
    kernels nothing is gathered."""
    hf = make_hf_model(kind)
    m = paged_copy(hf)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 256, (150,), generator=g).tolist()
    tail = torch.randint(0, 256, (40,), generator=g).tolist()
    results = {}
    for mode in ("1", "0"):
        m.set_backend(CpuKernelBackend(torch.float32, prefill_kernel=mode == "1",
                                       decode_kernel=mode == "1"))
        runner = PagedRunner(m, num_pages=64)
        a, b = Seq(), Seq()
        cold = runner.prefill(a, prompt, all_logits=True)
        chunked = runner.prefill(b, prompt, chunk=48, all_logits=True)
        fork = runner.fork(a, 144)                     # 144 cached tokens (9 pages)
        shared = torch.tensor(fork.pages)
        before = [(k[shared].clone(), v[shared].clone()) for k, v in zip(runner.kv.k, runner.kv.v)]
        after = runner.step([(fork, tail)], all_logits=True)[0]
        for (k0, v0), k, v in zip(before, runner.kv.k, runner.kv.v):  # shared pages unwritten
            assert torch.equal(k[shared], k0) and torch.equal(v[shared], v0)
        if mode == "1":
            assert runner.kv.num_scratch_allocs == 0  # read in place: nothing gathered
        want = hf_logits(hf, prompt)
        torch.testing.assert_close(cold, want, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(chunked, want, atol=2e-4, rtol=1e-4)
        torch.testing.assert_close(after, hf_logits(hf, prompt[:144] + tail)[144:], atol=2e-4,
                                   rtol=1e-4)
        results[mode] = torch.cat([cold, chunked, after])
    torch.testing.assert_close(results["1"], results["0"], atol=1e-4, rtol=1e-4)
