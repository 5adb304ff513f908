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
@pytest.mark.parametrize("rows,out", [(1, 96), (5, 96), (33, 96), (3, 1030)])
def test_int4_linear_within_stated_bound_of_dequantized_product(bits, rows, out):
    """1,030 output rows: not a multiple of the kernel's 16 (padded), over one packing
    chunk of 1,024."""
    g = torch.Generator().manual_seed(bits * 100 + rows)
    w = torch.randn(out, 256, generator=g)
    codes = AffineCodes.from_float(w, bits)
    bias = torch.randn(out, generator=g)
    residual = torch.randn(rows, out, generator=g)
    lin = Int4Linear(codes, bias)
    assert lin.planes == (1 if bits == 4 else 2)
    x = torch.randn(rows, 256, generator=g)
    y_ref = x.double() @ codes.dequantize().double().t()
    y = lin(x, residual=residual)
    assert y.dtype == torch.float32 and y.shape == (rows, out)
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


def held_weights_are_the_codes(model, bits: int) -> bool:
    """Every projection and ``lm_head`` is an :class:`Int4Linear` holding exactly its
    packed codes (``out * in / 2`` bytes per int4 plane) and bfloat16 scale/zero pairs
    (``in / 32 * out * 4`` bytes per plane), and no float matrix is held (their
    parameters are empty or shapes on ``meta``)."""
    planes = 1 if bits <= 4 else 2
    for layer in model.decoder_layers:
        for h in [*layer.linears()]:
            assert isinstance(h, Int4Linear) and h.planes == planes
            want = planes * (h.out_features * h.in_features // 2
                             + h.in_features // 32 * h.out_features * 4)
            assert h.nbytes == want
        for attr in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            w = getattr(layer, attr)
            assert w.device.type == "meta" or w.numel() == 0
    assert isinstance(model._lm_head, Int4Linear)
    return True


def test_int4_on_a_safetensors_checkpoint_holds_no_float_matrix(tmp_path):
    """``--quantization int4|int8`` on a Hugging Face checkpoint: each matrix is read and
    quantized alone (no float copy of the projections is ever held), and the logits are
    those of the float model quantized in memory (:func:`quantize.from_float`, the
    same codes), bit for bit."""
    from prefixcache.model import quantize
    from prefixcache.model.loader import load_model
    from tests.model.test_gguf import make_hf_model, our_logits, prompt

    torch.manual_seed(0)
    make_hf_model("llama").save_pretrained(str(tmp_path))
    for mode in ("int4", "int8"):
        loaded = load_model(str(tmp_path), quantization=mode)
        assert held_weights_are_the_codes(loaded.model, quantize.BITS[mode])
        assert loaded.model.embed.numel() > 0  # the embedding stays float
        ref = load_model(str(tmp_path), quantization="none")
        quantize.from_float(ref.model, quantize.BITS[mode])
        assert torch.equal(our_logits(loaded, prompt()), our_logits(ref, prompt()))


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K"])
def test_gguf_file_logits_within_bound_of_dequantized_float(tmp_path, monkeypatch, qtype):
    """The whole model kept quantized against the same file dequantized to float32: the
    logits differ by at most 3% of the largest logit (measured on these random models,
    0.3-2%: bfloat16 activations and scales in every linear, compounded over the layers);
    a lost or misplaced row or block moves them by O(scale). Q6_K (requantized to 8 bits)
    is bounded per weight only (``test_q6_k_is_requantized...``): on random Q6_K blocks,
    whose two 16-column sub-blocks per group have unrelated scales, the logits move by
    19% of the largest."""
    from prefixcache.model.loader import load_model
    from tests.model.test_gguf import make_hf_model, our_logits, prompt, write_gguf

    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    if qtype.endswith("_K"):
        import transformers
        config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, vocab_size=256,
                                          max_position_embeddings=512, rms_norm_eps=1e-5)
        hf = transformers.LlamaForCausalLM(config).eval()
    else:
        hf = make_hf_model("llama")
    file = write_gguf(hf, tmp_path / f"m.{qtype}.gguf", qtype)
    quant = load_model(str(file))
    assert quant.cache_id.endswith(":gguf")
    assert isinstance(quant.model.decoder_layers[0].down_proj, Int4Linear)
    assert held_weights_are_the_codes(quant.model, {"Q8_0": 8, "Q5_K": 5}.get(qtype, 4))
    assert not (quant.path / "model.safetensors").exists()  # no float32 conversion
    ids = prompt()
    got = our_logits(quant, ids)
    ref = our_logits(load_model(str(file), quantization="none"), ids)
    scale = float(ref.abs().max())
    err = float((got - ref).abs().max())
    print(qtype, "max |logit error| / max |logit|", err / scale)
    assert 0 < err <= 0.03 * scale
