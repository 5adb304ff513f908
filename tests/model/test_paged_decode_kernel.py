"""The in-place paged decode kernel against attention over gathered pages: every row,
padding, window, grouped-query layout and pool dtype; and the engine path that uses it."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.attention import plan_attention
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import paged_decode as kernel
from prefixcache.model.forward_batch import SeqChunk
from tests.helpers.hf_models import hf_logits, make_hf_model
from tests.helpers.kernels import built_or_skip
from tests.helpers.paged import PagedRunner, Seq, paged_copy


@pytest.fixture(scope="module")
def built():
    return built_or_skip(kernel, "decode")


def reference(q, k_pool, v_pool, table, ctx, window, dtype=torch.float64):
    """Plain softmax attention over each row's gathered keys, in ``dtype`` (float64: the
    reference; float32: what torch's own float32 arithmetic gets)."""
    out = []
    heads, kvh = q.shape[1], k_pool.shape[2]
    for b in range(q.shape[0]):
        n = int(ctx[b])
        k = k_pool[table[b]].flatten(0, 1)[:n].to(dtype)   # [n, kvh, d]
        v = v_pool[table[b]].flatten(0, 1)[:n].to(dtype)
        start = 0 if window is None else max(0, n - window)
        k, v = k[start:], v[start:]
        k = k.repeat_interleave(heads // kvh, dim=1)       # [n, heads, d]
        v = v.repeat_interleave(heads // kvh, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].to(dtype), k) * q.shape[-1] ** -0.5
        out.append(torch.einsum("hn,nhd->hd", s.softmax(-1), v))
    return torch.stack(out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh,d,bs", [
    (9, 3, 64, 16), (4, 4, 32, 8), (16, 2, 128, 32),
    # the 16-token fast path's head blocks: 1 and 2 query heads per KV head, 7 = 4 + 3
    # (head_dim 64), 6 = 2 + 2 + 2 (head_dim 128)
    (8, 8, 64, 16), (8, 4, 64, 16), (14, 2, 64, 16), (12, 2, 128, 16)])
@pytest.mark.parametrize("window", [None, 5, 40])
def test_kernel_matches_softmax_attention(built, dtype, heads, kvh, d, bs, window):
    g = torch.Generator().manual_seed(heads * 100 + d + bs)
    pool = 40
    k_pool = torch.randn(pool, bs, kvh, d, generator=g).to(dtype)
    v_pool = torch.randn(pool, bs, kvh, d, generator=g).to(dtype)
    ctx = torch.tensor([1, bs, bs + 1, 7 * bs - 3, 3])       # first token, exact pages, ragged
    max_pages = int(-(-ctx.max() // bs)) + 2                  # padded past every context
    table = torch.stack([torch.randperm(pool, generator=g)[:max_pages] for _ in ctx])
    q = torch.randn(len(ctx), heads, d, generator=g).to(dtype)
    k0, v0 = k_pool.clone(), v_pool.clone()
    got = built.paged_decode(q, k_pool, v_pool, table, ctx, window, d ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert torch.equal(k_pool, k0) and torch.equal(v_pool, v0)  # pages are only read
    want = reference(q.float(), k_pool.float(), v_pool.float(), table, ctx, window)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("heads,kvh", [(8, 4), (9, 3)])
def test_kernel_is_exact_on_peaked_scores(built, heads, kvh):
    """Scores hundreds apart (queries scaled by 60), ragged last pages: with exps below
    the kernel's floor (e^-86) and masked lanes the result stays as close to float64
    attention as torch's float32 softmax attention is (scores of that size carry float32
    rounding of about 1e-5)."""
    g = torch.Generator().manual_seed(heads + kvh)
    d, bs, pool = 64, 16, 30
    k_pool = torch.randn(pool, bs, kvh, d, generator=g)
    v_pool = torch.randn(pool, bs, kvh, d, generator=g)
    ctx = torch.tensor([5, 16, 77, 200])
    table = torch.stack([torch.randperm(pool, generator=g)[:13] for _ in ctx])
    q = torch.randn(len(ctx), heads, d, generator=g) * 60
    got = built.paged_decode(q, k_pool, v_pool, table, ctx, None, d ** -0.5)
    want = reference(q, k_pool, v_pool, table, ctx, None)
    for b, n in enumerate(ctx.tolist()):                    # every row of a page or more
        if n >= 16:                                         # reaches the floor
            k = k_pool[table[b]].flatten(0, 1)[:n].repeat_interleave(heads // kvh, 1)
            s = torch.einsum("hd,nhd->hn", q[b], k) * d ** -0.5
            assert ((s - s.amax(-1, keepdim=True)) < -86).float().mean() > 0.4
    torch32 = reference(q, k_pool, v_pool, table, ctx, None, dtype=torch.float32)
    torch_err = (torch32.double() - want).abs().max().item()
    assert 0 < torch_err < 1e-4
    assert (got.double() - want).abs().max().item() <= 1.5 * torch_err


def test_kernel_rejects_bad_tables(built):
    k = torch.zeros(4, 16, 1, 8)
    q = torch.zeros(1, 1, 8)
    with pytest.raises(RuntimeError, match="page id outside the pool"):
        built.paged_decode(q, k, k, torch.tensor([[4]]), torch.tensor([3]), None, 1.0)
    with pytest.raises(RuntimeError, match="ctx_lens beyond the page table"):
        built.paged_decode(q, k, k, torch.tensor([[0]]), torch.tensor([17]), None, 1.0)
    with pytest.raises(RuntimeError, match="ctx_lens beyond the page table"):
        built.paged_decode(q, k, k, torch.tensor([[0]]), torch.tensor([0]), None, 1.0)


def test_supports_names_what_it_cannot_do():
    assert kernel.supports(torch.zeros(2, 16, 3, 64), 9)
    assert not kernel.supports(torch.zeros(2, 16, 3, 64, dtype=torch.float16), 9)
    assert not kernel.supports(torch.zeros(2, 16, 3, 512), 9)     # head_dim > 256
    assert not kernel.supports(torch.zeros(2, 16, 1, 64), 32)     # 32 heads per KV head


def test_decode_groups_carry_contexts_and_window():
    seqs = [SeqChunk(0, 1, 40, torch.arange(3)), SeqChunk(1, 1, 33, torch.arange(3, 6))]
    plan = plan_attention(seqs, 8, torch.device("cpu"), 16)
    (group,) = plan.decode
    assert group.ctx_lens.tolist() == [40, 33] and group.window == 8
    assert group.mask is not None and group.mask.shape == (2, 1, 1, 48)
    (kernel_group,) = plan_attention(seqs, 8, torch.device("cpu"), 16, in_place=True).decode
    assert kernel_group.mask is None  # the kernel needs no gather mask: none is built
    assert torch.equal(kernel_group.page_table, group.page_table)


@pytest.mark.parametrize("kind", ["llama", "mistral_window"])
def test_engine_decode_in_place_equals_gathered_and_transformers(built, kind, monkeypatch):
    """The same steps with the kernel and with gathering: both match transformers."""
    hf = make_hf_model(kind)
    m = paged_copy(hf)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (150, 9, 33, 16)]
    results = {}
    for mode in ("1", "0"):
        m.set_backend(CpuKernelBackend(torch.float32, decode_kernel=mode == "1"))
        runner = PagedRunner(m, num_pages=64)
        seqs = [Seq() for _ in prompts]
        for s, p in zip(seqs, prompts):
            runner.prefill(s, p)
        allocs = runner.kv.num_scratch_allocs
        steps = [runner.step([(s, [t + 3]) for s in seqs]) for t in range(3)]
        if mode == "1":  # read in place: decode gathers nothing
            assert runner.kv.num_scratch_allocs == allocs
        results[mode] = torch.stack([torch.stack(x) for x in steps])
        for s, logits in zip(seqs, steps[-1]):
            torch.testing.assert_close(logits, hf_logits(hf, s.tokens)[-1], atol=2e-4,
                                       rtol=1e-4)
    torch.testing.assert_close(results["1"], results["0"], atol=1e-4, rtol=1e-4)
