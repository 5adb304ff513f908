"""``PagedLlama``: the Llama-family decoder (Llama, Mistral, Qwen2) over the paged KV pool.

Per layer: RMSNorm -> fused q/k/v projection -> RoPE -> write the step's new K/V into the
pool at ``slot_mapping`` -> attention of each sequence against its context KV gathered
through its page table -> output projection -> residual; RMSNorm -> SwiGLU MLP (fused
gate/up) -> residual. The final norm and ``lm_head`` run only on ``logits_indices``.

Two arithmetic modes, two sibling forward functions over ``DecoderLayer.qkv/finish`` and
the :class:`KVPool`; the engine's model runner picks one per engine:

* default (:func:`forward_default`, also ``PagedLlama.forward``): all new tokens of the
  step go through each linear layer as one matmul and each sequence's queries through
  one ``scaled_dot_product_attention``. Fastest; a token's
  values may differ at the floating-point level with the batch composition or chunking.
* deterministic (:func:`prefixcache.model.deterministic.forward_deterministic`):
  batch-invariant tiles; cost figures are in ``benchmarks/``.

On the CPU (float32), RoPE with the KV write, SiLU times up and RMSNorm's scaling run as
fused ops that return torch's bits (:mod:`prefixcache.model.kernels.fused_ops`), and
linears of 1-8 rows as a weight-streaming kernel (:mod:`~prefixcache.model.kernels.
small_gemm`, via :class:`PackedLinear`).

Limits: on the CPU, attention reads the KV pages in place (the paged decode and prefill
kernels of :mod:`prefixcache.model.kernels`); elsewhere, or for sliding-window layers'
prefill chunks, each sequence's context KV is gathered (copied) from its pages once per
layer. Sliding windows are applied by masking: all KV is kept, so outputs stay exact with
prefix caching.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

import prefixcache.model.host_memory as host_memory
from prefixcache.model.attention import (
    decode_in_place,
    paged_attention,
    plan_attention,
    prefill_in_place,
)
from prefixcache.model.config import ModelConfig
from prefixcache.model.forward_batch import ForwardBatch
from prefixcache.model.kernels import fused_ops
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.packed_linear import PackedLinear
from prefixcache.model.quantized_linear import AffineCodes, Int4Linear
from prefixcache.model.rope import RotaryEmbedding, apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fused: bool = False
             ) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32, returned in ``x.dtype``.
    ``fused``: the scaling runs as the exact fused CPU op (float32 rows, see
    :meth:`PagedLlama.fused_ops`), the same bits in one pass."""
    x32 = x.float()
    r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if fused:
        return fused_ops.rms_apply(x32, r, weight)
    return (x32 * r).to(x.dtype).mul_(weight)  # a new tensor either way: x is never written


def _param(*shape: int, device, dtype, arena: host_memory.HugePageArena | None = None
           ) -> nn.Parameter:
    return nn.Parameter(host_memory.empty(shape, dtype, device, arena), requires_grad=False)


class DecoderLayer(nn.Module):
    """Weights of one decoder layer (``d`` = head_dim).

    Attributes:
        input_norm ``[hidden]``; qkv_weight ``[(heads + 2 * kv_heads) * d, hidden]`` (rows:
        q, then k, then v), qkv_bias or None; o_weight ``[hidden, heads * d]``, o_bias or
        None; post_norm ``[hidden]``; gate_up_weight ``[2 * intermediate, hidden]`` (gate
        rows first), gate_up_bias or None; down_weight ``[hidden, intermediate]``,
        down_bias or None. ``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``: the
        same weights as :class:`PackedLinear` (prepacked for steps of two rows or more).
    """

    def __init__(self, cfg: ModelConfig, device, dtype,
                 arena: host_memory.HugePageArena | None = None):
        super().__init__()
        p = lambda *shape: _param(*shape, device=device, dtype=dtype, arena=arena)  # noqa: E731
        h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
        self.input_norm = p(h)
        self.qkv_weight = p(qkv_rows, h)
        self.qkv_bias = p(qkv_rows) if cfg.qkv_bias else None
        self.o_weight = p(h, cfg.num_attention_heads * d)
        self.o_bias = p(h) if cfg.o_bias else None
        self.post_norm = p(h)
        self.gate_up_weight = p(2 * i, h)
        self.gate_up_bias = p(2 * i) if cfg.mlp_bias else None
        self.down_weight = p(h, i)
        self.down_bias = p(h) if cfg.mlp_bias else None
        # multi-row steps use oneDNN-prepacked weights (packed on first use)
        self.qkv_proj: PackedLinear | Int4Linear = PackedLinear(self.qkv_weight, self.qkv_bias)
        self.o_proj: PackedLinear | Int4Linear = PackedLinear(self.o_weight, self.o_bias)
        self.gate_up_proj: PackedLinear | Int4Linear = PackedLinear(self.gate_up_weight,
                                                                    self.gate_up_bias)
        self.down_proj: PackedLinear | Int4Linear = PackedLinear(self.down_weight, self.down_bias)
        self.q_size = cfg.num_attention_heads * d
        self.kv_size = cfg.num_key_value_heads * d
        self.head_dim = d
        self.eps = cfg.rms_norm_eps

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fused: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed, projected, rotated q ``[N, heads, d]``, k and v ``[N, kv_heads, d]``
        for residual stream ``x [N, hidden]`` and RoPE ``cos``/``sin [N, d]``."""
        qkv = self.qkv_proj(rms_norm(x, self.input_norm, self.eps, fused))
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = apply_rope(qk.unflatten(-1, (-1, self.head_dim)), cos, sin)  # q and k together
        q, k = qk.split([self.q_size // self.head_dim, self.kv_size // self.head_dim], dim=1)
        return q, k, v.unflatten(-1, (-1, self.head_dim))

    def qkv_write(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVPool,
                  layer: int, slot_mapping: torch.Tensor, fused: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`qkv`, and the k and v of every row written to ``kv`` layer ``layer`` at
        ``slot_mapping [N]``; with ``fused`` (see :meth:`PagedLlama.fused_ops`) RoPE and
        the write are one pass over the projection, in place."""
        if not fused:
            q, k, v = self.qkv(x, cos, sin)
            kv.write(layer, slot_mapping, k, v)
            return q, k, v
        qkv = self.qkv_proj(rms_norm(x, self.input_norm, self.eps, fused))
        d = self.head_dim
        fused_ops.rope_write(qkv, cos, sin, self.q_size // d, slot_mapping, kv.k[layer],
                             kv.v[layer])
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return (q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)),
                v.unflatten(-1, (-1, d)))

    def finish(self, x: torch.Tensor, attn: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """Residual stream after the layer: ``x [N, hidden]`` plus the output projection of
        ``attn [N, heads * d]``, then plus the SwiGLU MLP (``fused``: RMSNorm's scaling and
        SiLU times up as the exact fused ops)."""
        x = self.o_proj(attn, residual=x)
        gate_up = self.gate_up_proj(rms_norm(x, self.post_norm, self.eps, fused))
        if fused:
            return self.down_proj(fused_ops.silu_mul(gate_up), residual=x)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate).mul_(up), residual=x)


class PagedLlama(nn.Module):
    """Llama-family causal LM reading and writing KV through a :class:`KVPool`.

    Args:
        config: hyper-parameters.
        device, dtype: where and in which float type (float32, bfloat16, float16) the
            weights live and the arithmetic runs. Parameters are uninitialised; fill them
            with :func:`prefixcache.model.weights.load_hf_weights`.

    Attributes:
        embed ``[vocab, hidden]``, layers (typed: :attr:`decoder_layers`), norm ``[hidden]``,
        lm_head ``[vocab, hidden]`` (the same tensor as ``embed`` when embeddings are tied).
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        # CPU weights on huge pages (host_memory): a one-row decode step reads them all
        arena = host_memory.HugePageArena()
        p = lambda *shape: _param(*shape, device=self.device, dtype=dtype, arena=arena)  # noqa: E731
        self.embed = p(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.device, dtype, arena)
                                    for _ in range(config.num_hidden_layers))
        self.norm = p(config.hidden_size)
        self.lm_head = self.embed if config.tie_word_embeddings else p(
            config.vocab_size, config.hidden_size)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                    self.device)
        self._lm_head: PackedLinear | Int4Linear = PackedLinear(self.lm_head)
        # set (and ``embed`` emptied) when the embedding is kept as codes
        self.embed_codes: AffineCodes | None = None

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """``layers`` as a typed list (iterating an ``nn.ModuleList`` gives plain
        ``nn.Module``s to a type checker)."""
        return cast(list[DecoderLayer], list(self.layers))

    def prepack(self) -> int:
        """Pack every :class:`PackedLinear` now (the loader calls it, so the first request
        does not pay for it); returns how many are packed (0 off float32 CPU)."""
        projs = [p for layer in self.decoder_layers
                 for p in (layer.qkv_proj, layer.o_proj, layer.gate_up_proj, layer.down_proj)]
        return sum(p.prepack() for p in [*projs, self._lm_head] if isinstance(p, PackedLinear))

    def new_kv_pool(self, num_pages: int, block_size: int = 16) -> KVPool:
        """A zeroed :class:`KVPool` matching this model's geometry, dtype and device."""
        c = self.config
        return KVPool(c.num_hidden_layers, num_pages, block_size, c.num_key_value_heads,
                      c.head_dim, self.dtype, self.device)

    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        """The default-mode step, :func:`forward_default`."""
        return forward_default(self, batch, kv)

    def max_context_len(self, batch: ForwardBatch) -> int:
        """The step's longest context in tokens (0 for an empty batch). Positions are not
        limited here: the engine admits requests up to its ``max_model_len``
        (``ModelConfig.check_max_model_len``), which may pass the trained length only
        with ``allow_long_context``."""
        return max((s.ctx_len for s in batch.seqs), default=0)

    def fused_ops(self) -> bool:
        """Whether this step's elementwise ops run as the exact fused CPU ops of
        :mod:`prefixcache.model.kernels.fused_ops` (a float32 CPU model, the ops built,
        switched on and bit-identical to torch's here); decided once per step."""
        return (self.device.type == "cpu" and self.dtype == torch.float32
                and fused_ops.available())

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``[N, hidden]`` (model dtype) of the token embedding for ``ids [N]``:
        ``embed``'s rows, or the rows of :attr:`embed_codes` dequantized (``code * scale +
        offset`` in float32, as the float reference computes them)."""
        if self.embed_codes is None:
            return F.embedding(ids, self.embed)
        c = self.embed_codes
        rows = c.codes[ids].view(ids.shape[0], -1, c.group).float()
        w = rows * c.scale[ids][..., None] + c.offset[ids][..., None]
        return w.view(ids.shape[0], -1).to(self.dtype)

    def logits(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        """Final norm and ``lm_head``: float32 ``[N, vocab]`` for residual rows ``[N, hidden]``."""
        return self._lm_head(rms_norm(x, self.norm, self.config.rms_norm_eps, fused)).float()


@torch.inference_mode()
def forward_default(model: PagedLlama, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
    """Run one step: write the KV of ``batch``'s new tokens into ``kv`` and return
    float32 logits ``[len(batch.logits_indices), vocab]`` for the rows
    ``batch.logits_indices``.

    """
    max_ctx = model.max_context_len(batch)
    cfg = model.config
    if not batch.seqs:
        return torch.empty(0, cfg.vocab_size, device=model.device)
    x = model.embed_tokens(batch.input_ids)
    cos, sin = model.rope.cos_sin(batch.positions, max_ctx - 1, model.dtype)
    decode_kernel = decode_in_place(kv, cfg.num_attention_heads)
    prefill_kernel = prefill_in_place(kv, cfg.num_attention_heads)
    fused = model.fused_ops()
    plans = {w: plan_attention(batch.seqs, w, model.device, kv.block_size,
                               in_place=decode_kernel, prefill_in_place=prefill_kernel)
             for w in set(cfg.layer_sliding_windows)}
    for i, layer in enumerate(model.decoder_layers):
        q, k, v = layer.qkv_write(x, cos, sin, kv, i, batch.slot_mapping, fused)
        attn = paged_attention(q, k, v, kv, i, plans[cfg.layer_sliding_windows[i]])
        x = layer.finish(x, attn, fused)
    return model.logits(x[batch.logits_indices], fused)
