"""Quantized weights (int4, int8 codes; a GGUF file's own layout): deterministic mode stays
bit-identical cold against warm, and the layout is part of the cache identity."""
from __future__ import annotations

import random

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.model.loader import load_tokenizer

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, logprobs=20, ignore_eos=True)


def signature(out):
    comp = out.outputs[0]
    return comp.token_ids, [sorted((t, lp.logprob) for t, lp in d.items()) for d in comp.logprobs]


def ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(n)]


def cold_then_warm(model, **kw):
    llm = LLM(model, block_size=16, num_pages=64, deterministic=True, **kw)
    prompt = ids(53, seed=5)
    cold = llm.generate([{"prompt_token_ids": prompt}], PARAMS)[0]
    llm.generate([{"prompt_token_ids": prompt[:40] + [7, 8]}], PARAMS)
    warm = llm.generate([{"prompt_token_ids": prompt}], PARAMS)[0]
    return llm, cold, warm


@pytest.mark.parametrize("quantization,dtype", [("int4", "float32"), ("int8", "float32"),
                                                ("none", "float32"), ("none", "bfloat16"),
                                                ("int4", "bfloat16")])
def test_cold_warm_bit_identical_on_quantized_weights(quantization, dtype):
    llm, cold, warm = cold_then_warm("builtin:tiny", quantization=quantization, dtype=dtype)
    assert warm.num_cached_tokens == 48 and cold.num_cached_tokens == 0
    assert signature(warm) == signature(cold)
    layout = "" if quantization == "none" else f":{quantization}"
    assert llm.engine.loaded.cache_id == "builtin:tiny" + layout
    cache_id = load_tokenizer("builtin:tiny", quantization=quantization)[1]
    assert cache_id == llm.engine.loaded.cache_id


def test_quantized_layers_replace_and_free_the_float_weights():
    from prefixcache.model.quantized_linear import Int4Linear

    prompt = {"prompt_token_ids": ids(40, seed=9)}
    p = SamplingParams(max_tokens=4, temperature=0.0, logprobs=5, ignore_eos=True)
    runs = {}
    for q in ("none", "int8"):
        llm = LLM("builtin:tiny", num_pages=32, quantization=q)
        runs[q] = signature(llm.generate([prompt], p)[0])
    model = llm.engine.model
    layer = model.decoder_layers[0]
    assert isinstance(layer.gate_up_proj, Int4Linear) and layer.gate_up_proj.planes == 2
    assert isinstance(model._lm_head, Int4Linear)
    assert layer.gate_up_weight.numel() == 0 and layer.qkv_weight.numel() == 0
    assert model.embed.numel() == 272 * 256  # the embedding stays float
    assert runs["int8"] != runs["none"]  # other weights, other logprobs


@pytest.mark.parametrize("backend", ["torch", "cpu", "cpu-kernels"])
def test_int4_on_every_compute_backend(backend):
    """The quantized handles run on each backend (mixed into it), bit-identical cold
    against warm, and the same bits on every backend (the linears are the same kernel;
    the other ops are each backend's, exact against torch's in float32)."""
    from prefixcache.model.quantize import QuantizedLinears

    llm, cold, warm = cold_then_warm("builtin:tiny", quantization="int4",
                                     compute_backend=backend)
    assert isinstance(llm.engine.model.backend, QuantizedLinears)
    assert signature(warm) == signature(cold)
    _, ref, _ = cold_then_warm("builtin:tiny", quantization="int4", compute_backend="torch")
    assert signature(cold)[0] == signature(ref)[0]
