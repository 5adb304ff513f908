"""Put a :class:`PagedLlama`'s linear layers on weight-only low-bit kernels
(:class:`~prefixcache.model.quantized_linear.Int4Linear`) at load.

Modes (``EngineConfig.quantization``, ``--quantization``):

* ``auto``: a GGUF file's weights stay in the file's layout (see
  :mod:`prefixcache.model.gguf_quant`); other models are not quantized.
* ``none``: float weights in the model's dtype (a GGUF file dequantized to float32).
* ``int4`` / ``int8``: every projection and ``lm_head`` quantized by min/max to 4 / 8-bit
  codes, one scale and offset per 32 input columns (group size 32), from the float
  weights (of any source, a GGUF file's dequantized ones included).

The token embedding stays a float tensor in the model's dtype (its lookup reads one row
per token; a GGUF file's is kept as codes, see ``loader.load_gguf_quantized``); norms and
biases too.

The quantized layers are one more kind of linear handle (:class:`Int4Linear`) on the
model's compute backend: :func:`with_quantized_linears` gives the backend (any of them)
a subclass that runs those handles and leaves every other op to the backend.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

import prefixcache.model.weights as weights
from prefixcache.config import QUANTIZATION_MODES
from prefixcache.model.backend import ComputeBackend
from prefixcache.model.llama import PagedLlama
from prefixcache.model.quantized_linear import AffineCodes, Int4Linear

MODES = QUANTIZATION_MODES
BITS = {"int4": 4, "int8": 8}


def check_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`MODES`.

    Raises:
        ValueError: naming ``quantization`` and the accepted values.
    """
    if mode not in MODES:
        raise ValueError(f"quantization: unsupported value {mode!r}; use one of "
                         f"{', '.join(MODES)}")
    return mode


class QuantizedLinears(ComputeBackend):
    """Mixed into a model's backend by :func:`with_quantized_linears`: an
    :class:`Int4Linear` handle runs its kernel, any other handle the backend's linear."""

    def finish_linear(self, prepared: object) -> bool:
        """Nothing to do for an :class:`Int4Linear` (packed when built)."""
        if isinstance(prepared, Int4Linear):
            return False
        return super().finish_linear(prepared)

    def linear(self, x: torch.Tensor, prepared: object,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        """:meth:`Int4Linear.__call__` for its handles, else the backend's linear."""
        if isinstance(prepared, Int4Linear):
            return prepared(x, residual)
        return super().linear(x, prepared, residual)


def with_quantized_linears(backend: ComputeBackend) -> ComputeBackend:
    """``backend`` with :class:`QuantizedLinears` mixed in (its state shared, its class
    a subclass of both), or ``backend`` itself when it has it already."""
    if isinstance(backend, QuantizedLinears):
        return backend
    cls = type(f"Quantized{type(backend).__name__}", (QuantizedLinears, type(backend)), {})
    new: ComputeBackend = object.__new__(cls)
    new.__dict__.update(backend.__dict__)
    return new


def _free(p: torch.Tensor | None) -> None:
    if p is not None and p.device.type != "meta":  # a meta weight holds no memory
        p.data = torch.empty(0, dtype=p.dtype, device=p.device)


@torch.inference_mode()
def apply(model: PagedLlama, codes_of: Callable[[str], AffineCodes]) -> int:
    """Replace every projection and ``lm_head`` of ``model`` with an :class:`Int4Linear`
    of ``codes_of(HF name)`` (q/k/v and gate/up fused as the float layers are), one
    layer at a time, and free the float weights they replace (a model built with
    ``float_linears=False`` has none). Returns the bytes the new layers hold.

    Raises:
        ValueError: a weight's shape does not match the config (named).
    """
    total = 0
    model.set_backend(with_quantized_linears(model.backend))

    def make(names: list[str], like: torch.Tensor, bias: torch.Tensor | None) -> Int4Linear:
        nonlocal total
        parts = [codes_of(n) for n in names]
        codes = parts[0] if len(parts) == 1 else AffineCodes.cat(parts)
        if codes.shape != tuple(like.shape):
            raise ValueError(f"weight {' + '.join(names)} has shape {codes.shape}, expected "
                             f"{tuple(like.shape)} from config.json")
        dev = model.device
        codes = AffineCodes(codes.codes.to(dev), codes.scale.to(dev), codes.offset.to(dev),
                            codes.bits, codes.group)
        lin = Int4Linear(codes, bias)
        total += lin.nbytes
        return lin

    names = weights.linear_weight_names(model)
    for n, layer in enumerate(model.decoder_layers):
        pre = f"model.layers.{n}."
        handles = {}
        for attr, parts in names.items():
            bias = getattr(layer, attr.replace("_weight", "_bias"))
            handles[attr] = make([pre + p for p in parts], getattr(layer, attr), bias)
        layer.qkv_proj, layer.o_proj = handles["qkv_weight"], handles["o_weight"]
        layer.gate_up_proj, layer.down_proj = handles["gate_up_weight"], handles["down_weight"]
        for attr in names:
            _free(getattr(layer, attr))
    tied = model.config.tie_word_embeddings
    model._lm_head = make(["model.embed_tokens.weight" if tied else "lm_head.weight"],
                          model.lm_head, None)
    if not tied:
        _free(model.lm_head)
    return total


def matrix_names(model: PagedLlama) -> set[str]:
    """The HF names :func:`apply` reads: every projection, and ``lm_head.weight`` (or
    the embedding, when tied)."""
    names = {f"model.layers.{n}.{p}" for n in range(model.config.num_hidden_layers)
             for parts in weights.linear_weight_names(model).values() for p in parts}
    tied = model.config.tie_word_embeddings
    return names | {"model.embed_tokens.weight" if tied else "lm_head.weight"}


def from_float(model: PagedLlama, bits: int) -> int:
    """:func:`apply` with codes from ``model``'s own (loaded) float weights, ``bits``
    wide, group size 32. Returns the bytes the new layers hold."""
    c = model.config
    d = c.head_dim
    sizes = {"q": c.num_attention_heads * d, "k": c.num_key_value_heads * d,
             "v": c.num_key_value_heads * d}

    def weight_of(name: str) -> torch.Tensor:
        parts = name.split(".")
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            return model.lm_head
        layer = model.decoder_layers[int(parts[2])]
        proj = parts[4]
        if proj in ("q_proj", "k_proj", "v_proj"):
            start = {"q_proj": 0, "k_proj": sizes["q"],
                     "v_proj": sizes["q"] + sizes["k"]}[proj]
            return layer.qkv_weight[start:start + sizes[proj[0]]]
        if proj in ("gate_proj", "up_proj"):
            i = c.intermediate_size
            return layer.gate_up_weight[(0 if proj == "gate_proj" else i):][:i]
        return {"qkv_proj": layer.qkv_weight, "gate_up_proj": layer.gate_up_weight,
                "o_proj": layer.o_weight, "down_proj": layer.down_weight}[proj]

    return apply(model, lambda name: AffineCodes.from_float(weight_of(name), bits))
