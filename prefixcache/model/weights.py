"""Hugging Face parameter names -> :class:`PagedLlama` parameters.

HF names (``N`` = layer): ``model.embed_tokens.weight``, ``model.norm.weight``,
``lm_head.weight`` (absent when tied), ``model.layers.N.input_layernorm.weight``,
``model.layers.N.post_attention_layernorm.weight``,
``model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}``,
``model.layers.N.mlp.{gate,up,down}_proj.{weight,bias}``. q/k/v are fused into one
matrix, gate/up into another.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from prefixcache.model.llama import PagedLlama

# Keys some checkpoints carry that the model recomputes instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expected_hf_keys(model: PagedLlama) -> set[str]:
    """Every HF tensor name ``model`` needs."""
    c = model.config
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not c.tie_word_embeddings:
        keys.add("lm_head.weight")
    for n in range(c.num_hidden_layers):
        pre = f"model.layers.{n}."
        keys |= {pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"}
        for proj in "qkv":
            keys.add(f"{pre}self_attn.{proj}_proj.weight")
            if c.qkv_bias:
                keys.add(f"{pre}self_attn.{proj}_proj.bias")
        keys.add(pre + "self_attn.o_proj.weight")
        if c.o_bias:
            keys.add(pre + "self_attn.o_proj.bias")
        for proj in ("gate", "up", "down"):
            keys.add(f"{pre}mlp.{proj}_proj.weight")
            if c.mlp_bias:
                keys.add(f"{pre}mlp.{proj}_proj.bias")
    return keys


def check_hf_keys(model: PagedLlama, available: set[str], source: str) -> None:
    """Raise ValueError naming the first missing or unexpected tensor name.

    ``lm_head.weight`` is tolerated (and ignored) when the embeddings are tied.
    """
    expected = expected_hf_keys(model)
    missing = sorted(expected - available)
    if missing:
        raise ValueError(f"{source}: missing weight {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = sorted(k for k in available - expected
                   if not k.endswith(_IGNORED_SUFFIXES) and k != "lm_head.weight")
    if extra:
        raise ValueError(f"{source}: unexpected weight {extra[0]!r}"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                         + f"; does the config match ({model.config.architecture})?")


@torch.inference_mode()
def load_hf_weights(model: PagedLlama, get: Callable[[str], torch.Tensor],
                    skip: Callable[[str], bool] = lambda name: False) -> None:
    """Copy HF-named tensors into ``model`` (converted to its dtype and device).

    Args:
        get: returns the tensor of an HF name (any device/dtype). Call
            :func:`check_hf_keys` first for a readable error on missing names.
        skip: names not to copy (their tensors are left unwritten: a quantized layer
            replaces them); a fused weight is skipped when its first part is.

    Raises:
        ValueError: a tensor's shape does not match the config (message names it).
    """

    def put(dst: torch.Tensor, *names: str) -> None:
        if skip(names[0]):
            return
        parts = [get(n) for n in names]
        src = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if src.shape != dst.shape:
            raise ValueError(f"weight {' + '.join(names)} has shape {tuple(src.shape)}, "
                             f"expected {tuple(dst.shape)} from config.json")
        dst.copy_(src)

    c = model.config
    put(model.embed, "model.embed_tokens.weight")
    put(model.norm, "model.norm.weight")
    if not c.tie_word_embeddings:
        put(model.lm_head, "lm_head.weight")
    for n, layer in enumerate(model.decoder_layers):
        pre = f"model.layers.{n}."
        att, mlp = pre + "self_attn.", pre + "mlp."
        put(layer.input_norm, pre + "input_layernorm.weight")
        put(layer.post_norm, pre + "post_attention_layernorm.weight")
        put(layer.qkv_weight, *(f"{att}{p}_proj.weight" for p in "qkv"))
        if layer.qkv_bias is not None:
            put(layer.qkv_bias, *(f"{att}{p}_proj.bias" for p in "qkv"))
        put(layer.o_weight, att + "o_proj.weight")
        if layer.o_bias is not None:
            put(layer.o_bias, att + "o_proj.bias")
        put(layer.gate_up_weight, mlp + "gate_proj.weight", mlp + "up_proj.weight")
        if layer.gate_up_bias is not None:
            put(layer.gate_up_bias, mlp + "gate_proj.bias", mlp + "up_proj.bias")
        put(layer.down_weight, mlp + "down_proj.weight")
        if layer.down_bias is not None:
            put(layer.down_bias, mlp + "down_proj.bias")
