"""PackedLinear: the prepacked oneDNN head equals F.linear within float32 rounding."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixcache.model.cpu.packed_linear import PackedLinear


def test_matches_linear_for_every_row_count_and_repacks_after_a_write():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(1000, 64, generator=g)
    head = PackedLinear(w)
    assert head.enabled == torch.backends.mkldnn.is_available()
    for n in (1, 2, 3, 8, 17, 64):
        x = torch.randn(n, 64, generator=g)
        got = head(x)
        assert got.shape == (n, 1000) and got.dtype == torch.float32
        torch.testing.assert_close(got, F.linear(x, w), atol=1e-4, rtol=1e-5)
    with torch.inference_mode():
        w.mul_(2.0)  # a new weight (version bump): the packed copy is remade
        x = torch.randn(4, 64, generator=g)
        torch.testing.assert_close(head(x), F.linear(x, w), atol=2e-4, rtol=1e-5)


def test_one_row_is_exactly_f_linear_without_the_streaming_kernel():
    w = torch.randn(300, 32)
    x = torch.randn(1, 32)
    assert torch.equal(PackedLinear(w)(x), F.linear(x, w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_other_dtypes_use_f_linear(dtype):
    w = torch.randn(50, 16).to(dtype)
    head = PackedLinear(w)
    assert not head.enabled
    x = torch.randn(4, 16).to(dtype)
    assert torch.equal(head(x), F.linear(x, w))


def test_bias_is_added_and_the_weight_is_packed_once():
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(200, 48, generator=g), torch.randn(200, generator=g)
    lin = PackedLinear(w, b)
    for n in (1, 5, 16, 5):
        x = torch.randn(n, 48, generator=g)
        torch.testing.assert_close(lin(x), F.linear(x, w, b), atol=1e-4, rtol=1e-5)
    assert lin.num_packs == (1 if lin.enabled else 0)  # one-row calls never pack


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_is_added_in_the_epilogue_with_the_same_bits(bias, dtype):
    """``lin(x, residual=r)`` is exactly ``r + lin(x)`` on every path (packed, one row,
    other dtypes), and neither input is written."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(96, 40, generator=g).to(dtype)
    b = torch.randn(96, generator=g).to(dtype) if bias else None
    lin = PackedLinear(w, b)
    for n in (1, 2, 9, 300):
        x = torch.randn(n, 40, generator=g).to(dtype)
        r = torch.randn(n, 96, generator=g).to(dtype)
        x0, r0 = x.clone(), r.clone()
        assert torch.equal(lin(x, residual=r), r + lin(x))
        assert torch.equal(x, x0) and torch.equal(r, r0)
    x = torch.randn(4, 40, generator=g).to(dtype)
    row = torch.randn(96, generator=g).to(dtype)            # broadcast, as F.linear + r
    assert torch.equal(lin(x, residual=row), row + lin(x))
    wide = torch.randn(4, 96, generator=g).double()           # promoted, as F.linear + r
    out = lin(x, residual=wide)
    assert out.dtype == torch.float64 and torch.equal(out, wide + lin(x))


def test_decoder_layers_pack_each_projection_once_over_many_steps():
    from prefixcache.model.config import ModelConfig
    from prefixcache.model.weights import load_hf_weights
    from tests.helpers.hf_models import make_hf_model
    from tests.helpers.paged import PagedRunner, Seq, cpu_model

    hf = make_hf_model("llama_bias")
    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    m = cpu_model(cfg)
    load_hf_weights(m, hf.state_dict().__getitem__)
    runner = PagedRunner(m, num_pages=16)
    a, b = Seq(), Seq()
    runner.step([(a, list(range(5, 25))), (b, list(range(30, 40)))])  # prefill: 30 rows
    for t in range(3):
        runner.step([(a, [t + 1]), (b, [t + 2])])  # decode: 2 rows
    runner.step([(a, [7])])  # one row: F.linear, nothing packed
    projs = [p for layer in m.decoder_layers
             for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
    assert len(projs) == 4 * cfg.num_hidden_layers
    assert [p.num_packs for p in projs] == [1 if p.enabled else 0 for p in projs]


def test_load_model_packs_before_the_first_request(tmp_path):
    import torch

    from prefixcache.model.loader import load_model
    from tests.helpers.hf_models import make_hf_model, save_hf_model
    from tests.helpers.paged import PagedRunner, Seq

    m = load_model(str(save_hf_model(make_hf_model("llama"), tmp_path / "m")), "cpu",
                   torch.float32).model
    projs = [p for layer in m.decoder_layers
             for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
    packed = [1 if p.enabled else 0 for p in projs]
    assert [p.num_packs for p in projs] == packed        # at load, not on first use
    PagedRunner(m, num_pages=8).step([(Seq(), list(range(3, 23)))])  # a 20-row prefill
    assert [p.num_packs for p in projs] == packed        # no second pack
    assert m.prepack() == sum(packed) + (1 if m._lm_head.enabled else 0)
    assert [p.num_packs for p in projs] == packed        # already packed: nothing redone
