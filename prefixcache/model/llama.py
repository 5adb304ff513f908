"""``PagedLlama``: the Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Phi-3/Phi-4-mini,
Gemma 3 text) over the paged KV pool; the families' differences are switches of
:class:`~prefixcache.model.config.ModelConfig`.

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

Every op with more than one implementation (linears, RMSNorm, RoPE with the KV write,
SiLU times up, attention, where tensors are placed) goes through the model's
:class:`~prefixcache.model.backend.ComputeBackend`, chosen once at load: plain torch (the
CUDA path: each sequence's context KV is gathered from its pages once per layer), or the
CPU backend (:mod:`prefixcache.model.cpu.backend`: KV read in place by the paged kernels,
exact fused ops, small GEMM, prepacked linears, huge pages). Sliding windows are applied
by masking: all KV is kept, so outputs stay exact with prefix caching.

Per family: Qwen3 and Gemma 3 norm each q and k head before RoPE; Gemma 3 norms the
attention and MLP outputs before their residual adds, scales the embeddings, uses
``gelu_pytorch_tanh`` and its own query scale, and rotates its sliding-window layers with a
second RoPE base; Phi-4-mini rotates only the first ``rotary_dim`` dimensions of a head.
These layers' q/k go through plain torch ops (RMSNorm and RoPE of
:class:`~prefixcache.model.backend.TorchBackend`, then the pool write), not the backend's
fused RoPE write.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from prefixcache.model.backend import Allocator, ComputeBackend, TorchBackend
from prefixcache.model.config import ModelConfig, RopeScaling
from prefixcache.model.forward_batch import ForwardBatch
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.quantized_linear import AffineCodes
from prefixcache.model.rope import RotaryEmbedding, apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32, returned in ``x.dtype`` (the
    plain-torch op, :meth:`ComputeBackend.rms_norm`)."""
    return TorchBackend().rms_norm(x, weight, eps)


def _param(alloc: Allocator, *shape: int, device: torch.device, dtype: torch.dtype
           ) -> nn.Parameter:
    return nn.Parameter(alloc(shape, dtype, device), requires_grad=False)


def _meta(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A weight that a quantized layer replaces: its shape only (``meta`` device)."""
    return torch.empty(shape, dtype=dtype, device="meta")


class DecoderLayer(nn.Module):
    """Weights of one decoder layer (``d`` = head_dim).

    Attributes:
        input_norm ``[hidden]``; qkv_weight ``[(heads + 2 * kv_heads) * d, hidden]`` (rows:
        q, then k, then v), qkv_bias or None; o_weight ``[hidden, heads * d]``, o_bias or
        None; post_norm ``[hidden]``; gate_up_weight ``[2 * intermediate, hidden]`` (gate
        rows first), gate_up_bias or None; down_weight ``[hidden, intermediate]``,
        down_bias or None. ``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``: the
        backend's handles of the same weights (:meth:`ComputeBackend.prepare_linear`).
        backend: the model's compute backend (:meth:`PagedLlama.set_backend`).
    """

    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                 backend: ComputeBackend, alloc: Allocator, linear_alloc: Allocator):
        super().__init__()
        p = lambda *shape: _param(alloc, *shape, device=device, dtype=dtype)  # noqa: E731
        m = lambda *shape: _param(linear_alloc, *shape, device=device,  # noqa: E731
                                  dtype=dtype)
        h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
        qkv_rows = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d
        self.input_norm = p(h)
        self.qkv_weight = m(qkv_rows, h)
        self.qkv_bias = p(qkv_rows) if cfg.qkv_bias else None
        self.o_weight = m(h, cfg.num_attention_heads * d)
        self.o_bias = p(h) if cfg.o_bias else None
        self.post_norm = p(h)
        self.gate_up_weight = m(2 * i, h)
        self.gate_up_bias = p(2 * i) if cfg.mlp_bias else None
        self.down_weight = m(h, i)
        self.down_bias = p(h) if cfg.mlp_bias else None
        self.q_norm = p(d) if cfg.qk_norm else None
        self.k_norm = p(d) if cfg.qk_norm else None
        self.attn_out_norm = p(h) if cfg.sandwich_norms else None
        self.mlp_out_norm = p(h) if cfg.sandwich_norms else None
        self.backend = backend
        self.qkv_proj = backend.prepare_linear(self.qkv_weight, self.qkv_bias)
        self.o_proj = backend.prepare_linear(self.o_weight, self.o_bias)
        self.gate_up_proj = backend.prepare_linear(self.gate_up_weight, self.gate_up_bias)
        self.down_proj = backend.prepare_linear(self.down_weight, self.down_bias)
        self.q_size = cfg.num_attention_heads * d
        self.kv_size = cfg.num_key_value_heads * d
        self.head_dim = d
        self.eps = cfg.rms_norm_eps
        self.rotary_dim = cfg.rotary_dim
        self.gelu = cfg.hidden_act == "gelu_pytorch_tanh"
        # q is scaled so that the attention's default head_dim ** -0.5 gives query_scale
        self.q_scale = (None if cfg.query_scale is None
                        or cfg.query_scale == d ** -0.5 else cfg.query_scale * d ** 0.5)
        # the backend's RoPE (and fused RoPE write) handles a plain full-rotary q/k only
        self.plain_qk = not cfg.qk_norm and self.rotary_dim == d and self.q_scale is None

    def linears(self) -> list[object]:
        """The layer's linear handles: q/k/v, output, gate/up, down."""
        return [self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj]

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed, projected, rotated q ``[N, heads, d]``, k and v ``[N, kv_heads, d]``
        for residual stream ``x [N, hidden]`` and RoPE ``cos``/``sin [N, d]``."""
        b = self.backend
        qkv = b.linear(b.rms_norm(x, self.input_norm, self.eps), self.qkv_proj)
        if self.plain_qk:
            return b.rope(qkv, cos, sin, self.q_size // self.head_dim, self.head_dim)
        return self._family_qk(qkv, cos, sin)

    def _family_qk(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of ``qkv`` for the families' variants: q/k RMSNorm per head, partial
        rotary (``cos``/``sin [N, rotary_dim]``), the query scale."""
        d = self.head_dim
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        qk = qk.unflatten(-1, (-1, d))
        heads = self.q_size // d
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([heads, self.kv_size // d], dim=1)
            qk = torch.cat([rms_norm(q, self.q_norm, self.eps),
                            rms_norm(k, self.k_norm, self.eps)], dim=1)
        rd = self.rotary_dim
        if rd == d:
            qk = apply_rope(qk, cos, sin)  # q and k together
        else:  # partial rotary: the last head_dim - rotary_dim dimensions pass through
            qk = torch.cat([apply_rope(qk[..., :rd], cos, sin), qk[..., rd:]], dim=-1)
        q, k = qk.split([heads, self.kv_size // d], dim=1)
        if self.q_scale is not None:
            q = q * self.q_scale
        return q, k, v.unflatten(-1, (-1, d))

    def qkv_write(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVPool,
                  layer: int, slot_mapping: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`qkv`, and the k and v of every row written to ``kv`` layer ``layer`` at
        ``slot_mapping [N]``."""
        b = self.backend
        qkv = b.linear(b.rms_norm(x, self.input_norm, self.eps), self.qkv_proj)
        if self.plain_qk:
            return b.rope_write(qkv, cos, sin, self.q_size // self.head_dim, self.head_dim,
                                kv, layer, slot_mapping)
        q, k, v = self._family_qk(qkv, cos, sin)
        kv.write(layer, slot_mapping, k, v)
        return q, k, v

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual stream after the layer: ``x [N, hidden]`` plus the output projection of
        ``attn [N, heads * d]``, then plus the gated MLP. With sandwich norms (Gemma 3)
        each branch's output is normed before it is added."""
        b = self.backend
        if self.attn_out_norm is not None and self.mlp_out_norm is not None:
            x = x + b.rms_norm(b.linear(attn, self.o_proj), self.attn_out_norm, self.eps)
            gate_up = b.linear(b.rms_norm(x, self.post_norm, self.eps), self.gate_up_proj)
            h = b.linear(self._act(gate_up), self.down_proj)
            return x + b.rms_norm(h, self.mlp_out_norm, self.eps)
        x = b.linear(attn, self.o_proj, residual=x)
        gate_up = b.linear(b.rms_norm(x, self.post_norm, self.eps), self.gate_up_proj)
        return b.linear(self._act(gate_up), self.down_proj, residual=x)

    def _act(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``act(gate) * up`` ``[N, intermediate]`` for ``gate_up [N, 2 * intermediate]``."""
        if self.gelu:
            gate, up = gate_up.chunk(2, dim=-1)
            return F.gelu(gate, approximate="tanh").mul_(up)
        return self.backend.silu_mul(gate_up)


class PagedLlama(nn.Module):
    """Llama-family causal LM reading and writing KV through a :class:`KVPool`.

    Args:
        config: hyper-parameters.
        device, dtype: where and in which float type (float32, bfloat16, float16) the
            weights live and the arithmetic runs. Parameters are uninitialised; fill them
            with :func:`prefixcache.model.weights.load_hf_weights`.
        backend: the compute backend (default :class:`TorchBackend`); the loader picks it
            once (:func:`prefixcache.model.loader.make_backend`).
        float_linears: ``False`` for a model whose projections and ``lm_head`` are
            replaced by quantized layers at load (:func:`prefixcache.model.quantize.apply`):
            their float weights are then shapes on the ``meta`` device, never memory (an
            untied ``lm_head`` too; a tied one is the embedding, always allocated).

    Attributes:
        embed ``[vocab, hidden]``, layers (typed: :attr:`decoder_layers`), norm ``[hidden]``,
        lm_head ``[vocab, hidden]`` (the same tensor as ``embed`` when embeddings are tied).
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, backend: ComputeBackend | None = None,
                 float_linears: bool = True):
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.backend = backend = backend or TorchBackend()
        alloc = backend.weight_allocator()
        lin = alloc if float_linears else _meta
        p = lambda *shape: _param(alloc, *shape, device=self.device, dtype=dtype)  # noqa: E731
        self.embed = p(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.device, dtype, backend, alloc,
                                                 lin)
                                    for _ in range(config.num_hidden_layers))
        self.norm = p(config.hidden_size)
        self.lm_head = self.embed if config.tie_word_embeddings else _param(
            lin, config.vocab_size, config.hidden_size, device=self.device, dtype=dtype)
        self.rope = RotaryEmbedding(config.rotary_dim, config.rope_theta, config.rope_scaling,
                                    self.device)
        # Gemma 3: the sliding-window layers rotate with their own, unscaled base
        self.local_rope = self.rope if config.local_rope_theta is None else RotaryEmbedding(
            config.rotary_dim, config.local_rope_theta, RopeScaling(), self.device)
        self.layer_ropes = [self.local_rope if w is not None else self.rope
                            for w in config.layer_sliding_windows]
        self._lm_head = backend.prepare_linear(self.lm_head)
        # set (and ``embed`` emptied) when the embedding is kept as codes
        self.embed_codes: AffineCodes | None = None

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """``layers`` as a typed list (iterating an ``nn.ModuleList`` gives plain
        ``nn.Module``s to a type checker)."""
        return cast(list[DecoderLayer], list(self.layers))

    def set_backend(self, backend: ComputeBackend) -> None:
        """Run on ``backend`` from now on. Its linear handles must be those of the current
        backend (the A/B benchmarks switch between CPU backends with different kernel
        switches); another kind of backend needs a model loaded for it."""
        if type(backend).prepare_linear is not type(self.backend).prepare_linear:
            raise ValueError(f"backend: {backend!r} prepares linears otherwise than "
                             f"{self.backend!r}; load the model for it")
        self.backend = backend
        for layer in self.decoder_layers:
            layer.backend = backend

    def prepack(self) -> int:
        """Finish every linear handle now (:meth:`ComputeBackend.finish_linear`: the CPU
        backend packs its weights; the loader calls it after the weights are filled, so the
        first request does not pay for it); returns how many did something."""
        handles = [h for layer in self.decoder_layers for h in layer.linears()]
        return sum(self.backend.finish_linear(h) for h in [*handles, self._lm_head])

    def new_kv_pool(self, num_pages: int, block_size: int = 16,
                    dtype: torch.dtype | None = None) -> KVPool:
        """A zeroed :class:`KVPool` matching this model's geometry and device, allocated
        by its backend, of ``dtype`` (default: the model's; ``torch.int8`` for codes and
        scales)."""
        c = self.config
        return KVPool(c.num_hidden_layers, num_pages, block_size, c.num_key_value_heads,
                      c.head_dim, dtype or self.dtype, self.device, zeros=self.backend.zeros)

    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        """The default-mode step, :func:`forward_default`."""
        return forward_default(self, batch, kv)

    def max_context_len(self, batch: ForwardBatch) -> int:
        """The step's longest context in tokens (0 for an empty batch). Positions are not
        limited here: the engine admits requests up to its ``max_model_len``
        (``ModelConfig.check_max_model_len``), which may pass the trained length only
        with ``allow_long_context``."""
        return max((s.ctx_len for s in batch.seqs), default=0)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[T, hidden]`` (model dtype) of int64 ``input_ids [T]``: ``embed``'s
        rows, or the rows of :attr:`embed_codes` dequantized (``code * scale + offset`` in
        float32, as the float reference computes them); times ``embed_scale`` (Gemma)."""
        if self.embed_codes is None:
            x = F.embedding(input_ids, self.embed)
        else:
            c, n = self.embed_codes, input_ids.shape[0]
            rows = c.codes[input_ids].view(n, -1, c.group).float()
            w = rows * c.scale[input_ids][..., None] + c.offset[input_ids][..., None]
            x = w.view(n, -1).to(self.dtype)
        scale = self.config.embed_scale
        return x if scale is None else x * torch.tensor(scale, dtype=self.dtype)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and ``lm_head``: float32 ``[N, vocab]`` for residual rows ``[N, hidden]``
        (soft-capped, ``c * tanh(logits / c)``, when the config says so)."""
        b = self.backend
        out = b.linear(b.rms_norm(x, self.norm, self.config.rms_norm_eps),
                       self._lm_head).float()
        cap = self.config.final_logit_softcapping
        return out if cap is None else torch.tanh(out / cap) * cap


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
    ropes = {id(r): r.cos_sin(batch.positions, max_ctx - 1, model.dtype)  # one unless Gemma 3
             for r in {id(r): r for r in (model.rope, model.local_rope)}.values()}
    plans = {w: model.backend.plan_attention(batch.seqs, w, kv, cfg.num_attention_heads,
                                             model.device)
             for w in set(cfg.layer_sliding_windows)}
    for i, layer in enumerate(model.decoder_layers):
        cos, sin = ropes[id(model.layer_ropes[i])]
        q, k, v = layer.qkv_write(x, cos, sin, kv, i, batch.slot_mapping)
        attn = model.backend.attention(q, k, v, kv, i, plans[cfg.layer_sliding_windows[i]])
        x = layer.finish(x, attn)
    return model.logits(x[batch.logits_indices])
