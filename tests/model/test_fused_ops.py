"""The fused CPU elementwise ops against the torch ops they replace, bit for bit: RoPE and
the KV write, SiLU times up, RMSNorm's scaling; their refusals; the load-time check that
turns them off when they differ; and whole model steps (prefill, a chunk after a cached
prefix, batched decode, both pool dtypes) with the ops and without them: equal logits and
equal pool contents."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.model.cpu.backend import CpuKernelBackend
from prefixcache.model.cpu.kernels import fused_ops
from prefixcache.model.llama import PagedLlama
from prefixcache.model.rope import apply_rope
from tests.helpers.hf_models import make_hf_model
from tests.helpers.kernels import built_or_skip
from tests.helpers.paged import PagedRunner, Seq, paged_copy


@pytest.fixture(scope="module")
def built():
    built_or_skip(fused_ops.build, "fused ops")
    if fused_ops.build_vector_width() != fused_ops.torch_vector_width():
        # e.g. ATEN_CPU_CAPABILITY set below the CPU's: torch's silu takes another exp, so
        # the load-time check must have switched the fused ops off
        assert not fused_ops.available()
        pytest.skip(f"torch's CPU kernels use {fused_ops.torch_vector_width()}-lane vectors, "
                    f"this build {fused_ops.build_vector_width()}: the fused ops stay off")
    assert fused_ops.available(), "fused ops built but differ from torch's ops here"
    return fused_ops


@pytest.mark.parametrize("rows,width", [(1, 1536), (7, 1408), (3, 1000), (2, 37), (4, 16),
                                        (300, 96)])
def test_silu_mul_is_torchs_bits(built, rows, width):
    g = torch.Generator().manual_seed(rows * width)
    gu = torch.randn(rows, 2 * width, generator=g) * 6
    gu[0, :4] = torch.tensor([0.0, -0.0, 88.0, -104.0])  # exp's edges
    gate, up = gu.chunk(2, dim=-1)
    got = built.silu_mul(gu)
    assert got.shape == (rows, width) and got.is_contiguous()
    assert torch.equal(got, F.silu(gate).mul_(up))
    strided = torch.randn(rows, 3 * width, generator=g)[:, :2 * width]  # a row stride of 3w
    gate, up = strided.chunk(2, dim=-1)
    assert torch.equal(built.silu_mul(strided), F.silu(gate).mul_(up))


@pytest.mark.parametrize("rows,width", [(1, 576), (2048, 576), (5, 37), (3, 512)])
def test_rms_apply_is_torchs_bits(built, rows, width):
    g = torch.Generator().manual_seed(rows + width)
    x = torch.randn(rows, width, generator=g) * 3
    w = torch.randn(width, generator=g)
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    got = built.rms_apply(x, r, w)
    assert torch.equal(got, (x * r).mul_(w))
    assert not got.data_ptr() == x.data_ptr()  # x is never written


@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kvh,d", [(9, 3, 64), (4, 4, 32), (8, 1, 128), (6, 2, 10)])
def test_rope_write_is_apply_rope_and_index_copy(built, pool_dtype, heads, kvh, d):
    n, bs, pages = 21, 4, 9
    g = torch.Generator().manual_seed(heads * d + kvh)
    qkv = torch.randn(n, (heads + 2 * kvh) * d, generator=g)
    ang = torch.rand(n, d // 2, generator=g) * 3000
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    slots = torch.randperm(pages * bs, generator=g)[:n]
    k_pool = torch.randn(pages, bs, kvh, d, generator=g).to(pool_dtype)
    v_pool = torch.randn(pages, bs, kvh, d, generator=g).to(pool_dtype)
    k_want, v_want = k_pool.clone(), v_pool.clone()
    rotated = apply_rope(qkv[:, :(heads + kvh) * d].unflatten(-1, (-1, d)), cos, sin)
    k_want.view(-1, kvh, d).index_copy_(0, slots, rotated[:, heads:].to(pool_dtype))
    v_want.view(-1, kvh, d).index_copy_(
        0, slots, qkv[:, (heads + kvh) * d:].unflatten(-1, (-1, d)).to(pool_dtype))
    got = qkv.clone()
    built.rope_write(got, cos, sin, heads, slots, k_pool, v_pool)
    assert torch.equal(got[:, :(heads + kvh) * d].unflatten(-1, (-1, d)), rotated)
    assert torch.equal(got[:, (heads + kvh) * d:], qkv[:, (heads + kvh) * d:])  # v as it was
    assert torch.equal(k_pool, k_want) and torch.equal(v_pool, v_want)  # other slots kept


def test_rope_write_refuses_bad_input_and_writes_nothing(built):
    heads, kvh, d, n = 2, 1, 8, 3
    qkv = torch.randn(n, (heads + 2 * kvh) * d)
    cos, sin = torch.ones(n, d), torch.zeros(n, d)
    k_pool, v_pool = torch.zeros(2, 4, kvh, d), torch.zeros(2, 4, kvh, d)
    before = qkv.clone()
    with pytest.raises(RuntimeError, match="slot outside the pool"):
        built.rope_write(qkv, cos, sin, heads, torch.tensor([0, 8, 1]), k_pool, v_pool)
    with pytest.raises(RuntimeError, match="slot outside the pool"):
        built.rope_write(qkv, cos, sin, heads, torch.tensor([0, -1, 1]), k_pool, v_pool)
    assert torch.equal(qkv, before) and not k_pool.any() and not v_pool.any()
    with pytest.raises(RuntimeError, match="qkv"):
        built.rope_write(qkv, cos, sin, heads + 1, torch.tensor([0, 1, 2]), k_pool, v_pool)
    with pytest.raises(RuntimeError, match="slots"):
        built.rope_write(qkv, cos, sin, heads, torch.tensor([0, 1]), k_pool, v_pool)
    with pytest.raises(RuntimeError, match="qkv"):
        built.rope_write(qkv.double(), cos, sin, heads, torch.tensor([0, 1, 2]), k_pool, v_pool)
    with pytest.raises(RuntimeError, match="gate_up"):
        built.silu_mul(torch.randn(2, 6).t())  # columns, not rows
    with pytest.raises(RuntimeError, match="weight"):
        built.rms_apply(torch.randn(2, 4), torch.ones(2, 1), torch.ones(5))


def test_a_differing_op_turns_the_fused_ops_off(built, monkeypatch, caplog):
    """The load-time check compares bits: an op off by one rounding fails it, and then
    the model keeps torch's ops."""
    real = fused_ops.silu_mul
    monkeypatch.setattr(fused_ops, "silu_mul", lambda gu: real(gu) * (1 + 2 ** -20))
    assert fused_ops._self_check() is False
    assert "silu_mul" in caplog.text
    monkeypatch.setattr(fused_ops, "silu_mul", real)
    assert fused_ops._self_check() is True
    monkeypatch.setattr(fused_ops, "_checked", False)
    assert not fused_ops.available()
    monkeypatch.setattr(fused_ops, "_checked", True)
    assert CpuKernelBackend(torch.float32).fused_ops  # available: the backend uses them
    assert not CpuKernelBackend(torch.float32, fused_ops=False).fused_ops  # its switch
    assert not CpuKernelBackend(torch.bfloat16).fused_ops  # float32 only


def _steps(m: PagedLlama, pool_dtype: torch.dtype) -> tuple[torch.Tensor, PagedRunner]:
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, 256, (150,), generator=g).tolist()
    tail = torch.randint(0, 256, (40,), generator=g).tolist()
    runner = PagedRunner(m, num_pages=64)
    runner.kv.k = [k.to(pool_dtype) for k in runner.kv.k]
    runner.kv.v = [v.to(pool_dtype) for v in runner.kv.v]
    a, b = Seq(), Seq()
    out = [runner.prefill(a, prompt, all_logits=True),
           runner.prefill(b, prompt[:100], chunk=33, all_logits=True)]
    fork = runner.fork(a, 144)
    out.append(runner.step([(fork, tail)], all_logits=True)[0])
    for _ in range(3):  # batched decode of three sequences
        out += [x[None] for x in runner.step([(a, [7]), (b, [9]), (fork, [11])])]
    return torch.cat(out), runner


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama_bias"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16])
def test_model_steps_with_fused_ops_are_bit_identical(built, kind, pool_dtype, monkeypatch):
    m = paged_copy(make_hf_model(kind))
    m.set_backend(CpuKernelBackend(torch.float32, fused_ops=False))
    want, ref = _steps(m, pool_dtype)
    m.set_backend(CpuKernelBackend(torch.float32, fused_ops=True))
    assert m.backend.fused_ops
    calls: dict[str, int] = {}

    def counting(name: str):
        real = getattr(fused_ops, name)

        def counted(*a):
            calls[name] = calls.get(name, 0) + 1
            return real(*a)
        return counted
    for name in ("rope_write", "silu_mul", "rms_apply"):
        monkeypatch.setattr(fused_ops, name, counting(name))
    got, run = _steps(m, pool_dtype)
    layers, steps = m.config.num_hidden_layers, 1 + 4 + 1 + 3
    # every step of every layer ran the fused ops (RMSNorm twice a layer, once at the end)
    assert calls == {"rope_write": layers * steps, "silu_mul": layers * steps,
                     "rms_apply": (2 * layers + 1) * steps}
    assert torch.equal(got, want)
    for k0, k1, v0, v1 in zip(ref.kv.k, run.kv.k, ref.kv.v, run.kv.v):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)
