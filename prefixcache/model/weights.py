"""Hugging Face parameter names -> :class:`PagedLlama` parameters.

HF names (``N`` = layer): ``model.embed_tokens.weight``, ``model.norm.weight``,
``lm_head.weight`` (absent when tied), ``model.layers.N.input_layernorm.weight``,
``model.layers.N.post_attention_layernorm.weight``,
``model.layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}``,
``model.layers.N.mlp.{gate,up,down}_proj.{weight,bias}``. q/k/v are fused into one
matrix, gate/up into another. Per family: Phi-3 checkpoints hold them fused already
(``self_attn.qkv_proj``, ``mlp.gate_up_proj``: rows q, k, v and gate, up, as ours);
Qwen3 and Gemma 3 add ``self_attn.{q,k}_norm.weight``; Gemma 3 adds
``pre_feedforward_layernorm`` (the MLP's input norm, which Llama calls
``post_attention_layernorm``), ``post_feedforward_layernorm``, and uses
``post_attention_layernorm`` for the attention output's norm; its norm weights are
stored as ``w`` for ``(1 + w)`` and loaded as ``1 + w`` (``norm_weight_offset``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from prefixcache.model.llama import PagedLlama

# Keys some checkpoints carry that the model recomputes instead.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _fused_qkv(model: PagedLlama) -> bool:
    """Phi-3 checkpoints hold q/k/v and gate/up fused."""
    return model.config.architecture == "Phi3ForCausalLM"


def _layer_names(model: PagedLlama) -> dict[str, list[str]]:
    """Our parameter name -> the HF names (under ``model.layers.N.``) concatenated into
    it, rows first to last, for the layers' present parameters."""
    c = model.config
    if _fused_qkv(model):
        qkv, gate_up = ["self_attn.qkv_proj"], ["mlp.gate_up_proj"]
    else:
        qkv = [f"self_attn.{p}_proj" for p in "qkv"]
        gate_up = ["mlp.gate_proj", "mlp.up_proj"]
    names = {"input_norm": ["input_layernorm.weight"],
             "qkv_weight": [f"{p}.weight" for p in qkv],
             "qkv_bias": [f"{p}.bias" for p in qkv],
             "o_weight": ["self_attn.o_proj.weight"], "o_bias": ["self_attn.o_proj.bias"],
             "gate_up_weight": [f"{p}.weight" for p in gate_up],
             "gate_up_bias": [f"{p}.bias" for p in gate_up],
             "down_weight": ["mlp.down_proj.weight"], "down_bias": ["mlp.down_proj.bias"],
             "q_norm": ["self_attn.q_norm.weight"], "k_norm": ["self_attn.k_norm.weight"]}
    if c.sandwich_norms:
        names.update(post_norm=["pre_feedforward_layernorm.weight"],
                     attn_out_norm=["post_attention_layernorm.weight"],
                     mlp_out_norm=["post_feedforward_layernorm.weight"])
    else:
        names["post_norm"] = ["post_attention_layernorm.weight"]
    layer = model.decoder_layers[0] if model.decoder_layers else None
    return {k: v for k, v in names.items() if layer is None or getattr(layer, k) is not None}


_LINEARS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")


def linear_weight_names(model: PagedLlama) -> dict[str, list[str]]:
    """Our projection weight name (``qkv_weight``, ``o_weight``, ``gate_up_weight``,
    ``down_weight``) -> the HF names under ``model.layers.N.`` whose rows it concatenates
    (one fused name for Phi-3's q/k/v and gate/up)."""
    names = _layer_names(model)
    return {k: names[k] for k in _LINEARS}


_NORMS = ("input_norm", "post_norm", "q_norm", "k_norm", "attn_out_norm", "mlp_out_norm")


def expected_hf_keys(model: PagedLlama) -> set[str]:
    """Every HF tensor name ``model`` needs."""
    c = model.config
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    if not c.tie_word_embeddings:
        keys.add("lm_head.weight")
    names = [n for parts in _layer_names(model).values() for n in parts]
    for n in range(c.num_hidden_layers):
        keys |= {f"model.layers.{n}.{name}" for name in names}
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

    offset = model.config.norm_weight_offset

    def put(dst: torch.Tensor, *names: str, norm: bool = False) -> None:
        if skip(names[0]):
            return
        parts = [get(n) for n in names]
        src = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if src.shape != dst.shape:
            raise ValueError(f"weight {' + '.join(names)} has shape {tuple(src.shape)}, "
                             f"expected {tuple(dst.shape)} from config.json")
        if norm and offset:
            src = src.float() + offset  # (1 + w), as Gemma computes it, in float32
        dst.copy_(src)

    c = model.config
    put(model.embed, "model.embed_tokens.weight")
    put(model.norm, "model.norm.weight", norm=True)
    if not c.tie_word_embeddings:
        put(model.lm_head, "lm_head.weight")
    layer_names = _layer_names(model)
    for n, layer in enumerate(model.decoder_layers):
        pre = f"model.layers.{n}."
        for attr, names in layer_names.items():
            put(getattr(layer, attr), *(pre + name for name in names), norm=attr in _NORMS)
