"""Weights kept quantized: GGUF blocks as affine codes, the int4 kernel's bound against the
dequantized float product, and the ``quantization`` setting."""
from __future__ import annotations

from types import SimpleNamespace

import gguf as gg
import numpy as np
import pytest
import torch

from prefixcache.config import EngineConfig
from prefixcache.model.gguf import dequantize
from prefixcache.model.gguf_quant import affine_codes
from prefixcache.model.quantized_linear import AffineCodes, Int4Linear, error_bound

ROWS, COLS = 24, 512


def reader_tensor(type_name: str, rows: int = ROWS, cols: int = COLS, seed: int = 0):
    """A stand-in for ``gguf.ReaderTensor``: ``rows x cols`` of type ``type_name``."""
    rng = np.random.default_rng(seed)
    qtype = getattr(gg.GGMLQuantizationType, type_name)
    block, nbytes = gg.GGML_QUANT_SIZES[qtype]
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):  # no quantizer in gguf: random blocks
        data = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
        d = rng.uniform(1e-3, 1e-2, (data.shape[0], 1)).astype(np.float16).view(np.uint8)
        if type_name == "Q6_K":
            data[:, -2:] = d
        else:
            data[:, 0:2] = d
            data[:, 2:4] = (rng.uniform(1e-3, 1e-2, (data.shape[0], 1))
                            .astype(np.float16).view(np.uint8))
        data = data.reshape(rows, -1)
    else:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        data = gg.quants.quantize(w, qtype)
    return SimpleNamespace(tensor_type=qtype, data=data, shape=np.array([cols, rows]),
                           name="blk.0.ffn_up.weight")


@pytest.mark.parametrize("type_name,bits", [("Q4_0", 4), ("Q4_1", 4), ("Q5_0", 5),
                                            ("Q5_1", 5), ("Q8_0", 8), ("Q4_K", 4),
                                            ("Q5_K", 5)])
def test_gguf_blocks_are_exact_affine_codes(type_name, bits):
    t = reader_tensor(type_name)
    codes, exact = affine_codes(t)
    assert exact and codes.bits == bits and codes.shape == (ROWS, COLS)
    assert int(codes.codes.max()) < 2 ** bits
    ref = torch.from_numpy(dequantize(t))
    # code * scale + offset is the file's value up to float32 rounding of the two ops
    tol = 2.0 ** -22 * (codes.codes.float().view(ROWS, -1, 32)
                        * codes.scale[..., None].abs()
                        + codes.offset[..., None].abs()).view(ROWS, COLS)
    err = (codes.dequantize() - ref).abs()
    assert bool((err <= tol).all()), float(err.max())
    # the codes span their range (not a constant, not rescaled)
    assert int(codes.codes.max()) - int(codes.codes.min()) >= 2 ** bits // 2


def test_q6_k_is_requantized_to_8_bits_within_half_a_step():
    t = reader_tensor("Q6_K")
    codes, exact = affine_codes(t)
    assert not exact and codes.bits == 8
    ref = torch.from_numpy(dequantize(t)).view(ROWS, -1, 32)
    half_step = ((ref.amax(-1) - ref.amin(-1)) / 510)[..., None]
    err = (codes.dequantize().view(ROWS, -1, 32) - ref).abs()
    # ties at exactly half a step occur on the Q6_K grid: float32 rounding on top
    assert bool((err <= half_step + 2.0 ** -20 * ref.abs().amax()).all())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_int4_linear_within_stated_bound_of_dequantized_product(bits, rows):
    g = torch.Generator().manual_seed(bits * 100 + rows)
    w = torch.randn(96, 256, generator=g)
    codes = AffineCodes.from_float(w, bits)
    bias = torch.randn(96, generator=g)
    residual = torch.randn(rows, 96, generator=g)
    lin = Int4Linear(codes, bias)
    assert lin.planes == (1 if bits == 4 else 2)
    x = torch.randn(rows, 256, generator=g)
    y_ref = x.double() @ codes.dequantize().double().t()
    y = lin(x, residual=residual)
    assert y.dtype == torch.float32 and y.shape == (rows, 96)
    err = (y.double() - bias.double() - residual.double() - y_ref).abs()
    bound = error_bound(x, codes, y_ref.float()).double() + 1e-5 * residual.abs().double()
    assert bool((err <= bound).all()), float((err / bound).max())
    assert float(err.max()) > 0  # the bound is not vacuous: bfloat16 rounding shows


def test_from_float_error_is_at_most_half_a_step():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    for bits in (4, 8):
        c = AffineCodes.from_float(w, bits)
        step = c.scale[..., None]
        err = (c.dequantize() - w).view(8, -1, 32).abs()
        assert bool((err <= step / 2 * (1 + 1e-5) + 1e-7).all())


def test_quantization_setting_is_checked():
    with pytest.raises(ValueError, match="quantization"):
        EngineConfig(model="builtin:tiny", quantization="int3")
    from prefixcache.model.loader import load_model
    with pytest.raises(ValueError, match="quantization"):
        load_model("builtin:tiny", quantization="fp4")
    with pytest.raises(ValueError, match="group size 32"):
        AffineCodes.from_float(torch.zeros(4, 40), 4)
