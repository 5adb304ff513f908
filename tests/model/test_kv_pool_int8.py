"""The int8 KV pool: codes and scales per (token, KV head), the error bound of a written
row, a page filled token by token, and attention over it within a bound derived from the
quantization error (both compute backends' attention paths)."""
from __future__ import annotations

import math

import pytest
import torch

from prefixcache.model.attention import paged_attention, plan_attention
from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.kv_pool import KVPool, dequantize_rows, quantize_rows

L, KVH, D, BS = 2, 2, 64, 16


def pool(dtype: torch.dtype, pages: int = 8) -> KVPool:
    return KVPool(L, pages, BS, KVH, D, dtype, "cpu")


def test_row_layout_and_error_bound():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, KVH, D, generator=g) * torch.logspace(-3, 2, 40).view(-1, 1, 1)
    x[3] = 0.0  # an all-zero row: scale 0, codes 0, read back exactly
    raw = quantize_rows(x)
    assert raw.dtype == torch.int8 and raw.shape == (40, KVH, D + 4)
    assert int(raw[..., :D].abs().max()) == 127  # each row's largest |x| is code +-127
    back = dequantize_rows(raw, D)
    amax = x.abs().amax(-1, keepdim=True)
    # |x - code * scale| <= scale / 2 = amax / 254, plus float32 rounding of x / scale
    assert ((back - x).abs() <= amax / 254 * (1 + 1e-5)).all()
    assert (back[3] == 0).all()
    assert torch.equal(raw[..., D:].contiguous().view(torch.float32), amax / 127)


def test_bytes_per_token_and_page_shape():
    assert KVPool.bytes_per_token(L, KVH, D, torch.float32) == 2 * L * KVH * D * 4
    assert KVPool.bytes_per_token(L, KVH, D, torch.bfloat16) == 2 * L * KVH * D * 2
    assert KVPool.bytes_per_token(L, KVH, D, torch.int8) == 2 * L * KVH * (D + 4)
    kv = pool(torch.int8)
    assert kv.page_shape == (2, L, BS, KVH, D + 4) and kv.quantized
    assert kv.page_nbytes == BS * KVPool.bytes_per_token(L, KVH, D, torch.int8)
    with pytest.raises(ValueError, match="head_dim"):
        KVPool(L, 4, BS, KVH, 30, torch.int8, "cpu")


def test_page_filled_token_by_token_equals_page_written_at_once():
    """Per-token scales: appending one token never changes the codes already written, so a
    page filled by decode holds the bytes a prefill of the same tokens writes."""
    x = torch.randn(BS, KVH, D, generator=torch.Generator().manual_seed(1))
    a, b = pool(torch.int8), pool(torch.int8)
    slots = torch.arange(BS) + 2 * BS  # page 2
    a.write(0, slots, x, -x)
    for t in range(BS):
        b.write(0, slots[t:t + 1], x[t:t + 1], -x[t:t + 1])
        assert torch.equal(b.k[0][2, :t + 1], a.k[0][2, :t + 1])
    assert torch.equal(a.export_pages([2]), b.export_pages([2]))
    c = pool(torch.int8)
    c.import_pages([5], a.export_pages([2]))
    k, _ = c.gather(0, torch.tensor([5]), BS)
    assert torch.equal(k, dequantize_rows(a.k[0][2], D))


def attention_bound(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Per query head, a bound on |attention(q, K', V') - attention(q, K, V)| when every
    row of K and V moves by at most its absmax / 254 (the int8 rows): logits move by at
    most delta = scale * |q|_1 * max_j |dK_j|_inf, so softmax weights by a factor within
    e^(+-2 delta), |dp|_1 <= e^(2 delta) - 1, and the output by max|dV| + |dp|_1 max|V|."""
    group = q.shape[1] // k.shape[1]
    dk = (k.abs().amax(-1) / 254).amax(0).repeat_interleave(group)   # [heads]
    dv = (v.abs().amax(-1) / 254).amax(0).repeat_interleave(group)
    vmax = v.abs().amax((0, 2)).repeat_interleave(group)
    delta = q.abs().sum(-1) * dk * q.shape[-1] ** -0.5                 # [T, heads]
    return dv + torch.expm1(2 * delta) * vmax + 1e-5


@pytest.mark.parametrize("backend", ["torch", "cpu-kernels"])
def test_attention_over_int8_pages_within_the_derived_bound(backend):
    g = torch.Generator().manual_seed(2)
    heads, ctx = 6, 70
    k = torch.randn(ctx, KVH, D, generator=g)
    v = torch.randn(ctx, KVH, D, generator=g)
    q = torch.randn(ctx, heads, D, generator=g)
    table = torch.tensor([3, 0, 6, 1, 5])  # 5 pages hold 70 tokens, out of order
    pos = torch.arange(ctx)
    slots = table[pos // BS] * BS + pos % BS
    outs = {}
    for dtype in (torch.float32, torch.int8):
        kv = pool(dtype)
        kv.write(1, slots, k, v)
        # a prefill chunk of 54 tokens after 16 (read from pages), and a decode row
        chunk = [SeqChunk(0, ctx - 16, ctx, table)]
        dec = [SeqChunk(0, 1, ctx, table)]
        if backend == "torch":
            o1 = paged_attention(q[16:], k[16:], v[16:], kv, 1,
                                 plan_attention(chunk, None, kv.device, BS))
            o2 = paged_attention(q[-1:], k[-1:], v[-1:], kv, 1,
                                 plan_attention(dec, None, kv.device, BS))
        else:
            b = CpuKernelBackend(torch.float32)
            o1 = b.attention(q[16:], k[16:], v[16:], kv, 1,
                             b.plan_attention(chunk, None, kv, heads, kv.device))
            o2 = b.attention(q[-1:], k[-1:], v[-1:], kv, 1,
                             b.plan_attention(dec, None, kv, heads, kv.device))
        outs[dtype] = (o1.view(-1, heads, D), o2.view(-1, heads, D))
    for ref, got, rows in zip(outs[torch.float32], outs[torch.int8], (q[16:], q[-1:])):
        err = (got - ref).abs().amax(-1)                               # [T, heads]
        bound = attention_bound(rows, k, v)
        assert (err <= bound).all(), float((err / bound).max())
        assert float(err.max()) > 0  # quantized: not the float32 result
    assert math.isfinite(float(outs[torch.int8][0].abs().max()))
