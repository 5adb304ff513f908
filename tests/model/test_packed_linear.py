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


def test_row_pieces_cover_every_row_count_with_a_bounded_set_of_kernel_shapes():
    from prefixcache.model.cpu.packed_linear import KERNEL_ROWS, row_pieces

    assert KERNEL_ROWS == (8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 512, 1024, 2048)
    assert row_pieces(1000) == [(0, 512, 512), (512, 256, 256), (768, 128, 128),
                                (896, 64, 64), (960, 40, 40)]
    assert row_pieces(2048) == [(0, 2048, 2048)]
    assert row_pieces(5000) == [(0, 2048, 2048), (2048, 2048, 2048), (4096, 512, 512),
                                (4608, 256, 256), (4864, 128, 128), (4992, 8, 8)]
    assert row_pieces(9) == [(0, 9, 16)] and row_pieces(63) == [(0, 63, 64)]
    used = set()
    for rows in range(1, 4200):
        pieces = row_pieces(rows)
        assert [p[0] for p in pieces] == [sum(p[1] for p in pieces[:i])
                                         for i in range(len(pieces))]
        assert sum(p[1] for p in pieces) == rows
        assert all(n == k for _, n, k in pieces[:-1]) and pieces[-1][2] - pieces[-1][1] < 8
        used.update(k for _, _, k in pieces)
    assert used == set(KERNEL_ROWS)
    with pytest.raises(ValueError, match="rows"):
        row_pieces(0)


def test_onednn_sees_only_the_bucketed_row_counts_and_the_bits_do_not_change(monkeypatch):
    """oneDNN caches a kernel per shape it is called with; over 600 distinct step sizes the
    packed path calls it with the 13 row counts of KERNEL_ROWS only, and every result is
    the bits of one oneDNN call over all the rows."""
    from prefixcache.model.cpu import packed_linear
    from prefixcache.model.cpu.packed_linear import KERNEL_ROWS

    g = torch.Generator().manual_seed(3)
    w, b = torch.randn(24, 16, generator=g), torch.randn(24, generator=g)
    lin = PackedLinear(w, b)
    if not lin.prepack():
        pytest.skip("no oneDNN packed path in this PyTorch")
    seen: list[tuple[int, bool]] = []
    plain, add = packed_linear._onednn_linear, packed_linear._onednn_linear_add
    monkeypatch.setattr(packed_linear, "_onednn_linear",
                        lambda x, p, bias: seen.append((x.shape[0], False)) or plain(x, p, bias))
    monkeypatch.setattr(packed_linear, "_onednn_linear_add",
                        lambda x, r, p, bias: seen.append((x.shape[0], True))
                        or add(x, r, p, bias))
    sizes = [*range(2, 600), 1000, 2047, 2048, 2049, 4100]
    for rows in sizes:
        x = torch.randn(rows, 16, generator=g)
        r = torch.randn(rows, 24, generator=g)
        assert torch.equal(lin(x), plain(x, lin._packed, b))
        assert torch.equal(lin(x, residual=r), add(x, r, lin._packed, b))
    assert {n for n, _ in seen} == set(KERNEL_ROWS)
    assert {mode for _, mode in seen} == {False, True}


def test_resident_memory_stays_bounded_over_many_step_sizes():
    """Resident memory of a fresh process over 500 distinct row counts, plain and with a
    residual. Each shape oneDNN is called with keeps about 0.5 MiB in its caches (measured:
    0.5-2 MiB), so handing it every row count grew this loop by about 790 MiB; bucketed, it
    builds 2 x 13 kernels at most. The band (150 MiB) is far from both."""
    import subprocess
    import sys

    code = """
import os, torch, psutil
from prefixcache.model.cpu.packed_linear import PackedLinear
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
lin = PackedLinear(torch.randn(512, 256, generator=g))
if not lin.prepack():
    print("SKIP"); raise SystemExit
proc = psutil.Process()
for rows in (9, 70):  # warm-up: the allocator's first arenas
    lin(torch.randn(rows, 256), residual=torch.randn(rows, 512))
before = proc.memory_info().rss
for rows in range(9, 509):
    lin(torch.randn(rows, 256))
    lin(torch.randn(rows, 256), residual=torch.randn(rows, 512))
print((proc.memory_info().rss - before) / 2**20)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, check=True).stdout.split()[-1]
    if out == "SKIP":
        pytest.skip("no oneDNN packed path in this PyTorch")
    assert float(out) < 150, f"resident memory grew by {out} MiB"
