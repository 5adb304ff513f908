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

Every op with more than one implementation (linears, RMSNorm, RoPE with the KV write,
SiLU times up, attention, where tensors are placed) goes through the model's
:class:`~prefixcache.model.backend.ComputeBackend`, chosen once at load: plain torch (the
CUDA path: each sequence's context KV is gathered from its pages once per layer), or the
CPU backend (:mod:`prefixcache.model.cpu.backend`: KV read in place by the paged kernels,
exact fused ops, small GEMM, prepacked linears, huge pages). Sliding windows are applied
by masking: all KV is kept, so outputs stay exact with prefix caching.
"""
from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from prefixcache.model.backend import Allocator, ComputeBackend, TorchBackend
from prefixcache.model.config import ModelConfig
from prefixcache.model.forward_batch import ForwardBatch
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.quantized_linear import AffineCodes
from prefixcache.model.rope import RotaryEmbedding


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in float32, returned in ``x.dtype`` (the
    plain-torch op, :meth:`ComputeBackend.rms_norm`)."""
    return TorchBackend().rms_norm(x, weight, eps)


def _param(alloc: Allocator, *shape: int, device: torch.device, dtype: torch.dtype
           ) -> nn.Parameter:
    return nn.Parameter(alloc(shape, dtype, device), requires_grad=False)


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
                 backend: ComputeBackend, alloc: Allocator):
        super().__init__()
        p = lambda *shape: _param(alloc, *shape, device=device, dtype=dtype)  # noqa: E731
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
        self.backend = backend
        self.qkv_proj = backend.prepare_linear(self.qkv_weight, self.qkv_bias)
        self.o_proj = backend.prepare_linear(self.o_weight, self.o_bias)
        self.gate_up_proj = backend.prepare_linear(self.gate_up_weight, self.gate_up_bias)
        self.down_proj = backend.prepare_linear(self.down_weight, self.down_bias)
        self.q_size = cfg.num_attention_heads * d
        self.kv_size = cfg.num_key_value_heads * d
        self.head_dim = d
        self.eps = cfg.rms_norm_eps

    def linears(self) -> list[object]:
        """The layer's linear handles: q/k/v, output, gate/up, down."""
        return [self.qkv_proj, self.o_proj, self.gate_up_proj, self.down_proj]

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Normed, projected, rotated q ``[N, heads, d]``, k and v ``[N, kv_heads, d]``
        for residual stream ``x [N, hidden]`` and RoPE ``cos``/``sin [N, d]``."""
        b = self.backend
        qkv = b.linear(b.rms_norm(x, self.input_norm, self.eps), self.qkv_proj)
        return b.rope(qkv, cos, sin, self.q_size // self.head_dim, self.head_dim)

    def qkv_write(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: KVPool,
                  layer: int, slot_mapping: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`qkv`, and the k and v of every row written to ``kv`` layer ``layer`` at
        ``slot_mapping [N]``."""
        b = self.backend
        qkv = b.linear(b.rms_norm(x, self.input_norm, self.eps), self.qkv_proj)
        return b.rope_write(qkv, cos, sin, self.q_size // self.head_dim, self.head_dim, kv,
                            layer, slot_mapping)

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual stream after the layer: ``x [N, hidden]`` plus the output projection of
        ``attn [N, heads * d]``, then plus the SwiGLU MLP."""
        b = self.backend
        x = b.linear(attn, self.o_proj, residual=x)
        gate_up = b.linear(b.rms_norm(x, self.post_norm, self.eps), self.gate_up_proj)
        return b.linear(b.silu_mul(gate_up), self.down_proj, residual=x)


class PagedLlama(nn.Module):
    """Llama-family causal LM reading and writing KV through a :class:`KVPool`.

    Args:
        config: hyper-parameters.
        device, dtype: where and in which float type (float32, bfloat16, float16) the
            weights live and the arithmetic runs. Parameters are uninitialised; fill them
            with :func:`prefixcache.model.weights.load_hf_weights`.
        backend: the compute backend (default :class:`TorchBackend`); the loader picks it
            once (:func:`prefixcache.model.loader.make_backend`).

    Attributes:
        embed ``[vocab, hidden]``, layers (typed: :attr:`decoder_layers`), norm ``[hidden]``,
        lm_head ``[vocab, hidden]`` (the same tensor as ``embed`` when embeddings are tied).
    """

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, backend: ComputeBackend | None = None):
        super().__init__()
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.backend = backend = backend or TorchBackend()
        alloc = backend.weight_allocator()
        p = lambda *shape: _param(alloc, *shape, device=self.device, dtype=dtype)  # noqa: E731
        self.embed = p(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, self.device, dtype, backend, alloc)
                                    for _ in range(config.num_hidden_layers))
        self.norm = p(config.hidden_size)
        self.lm_head = self.embed if config.tie_word_embeddings else p(
            config.vocab_size, config.hidden_size)
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling,
                                    self.device)
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

    def new_kv_pool(self, num_pages: int, block_size: int = 16) -> KVPool:
        """A zeroed :class:`KVPool` matching this model's geometry, dtype and device,
        allocated by its backend."""
        c = self.config
        return KVPool(c.num_hidden_layers, num_pages, block_size, c.num_key_value_heads,
                      c.head_dim, self.dtype, self.device, zeros=self.backend.zeros)

    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        """The default-mode step, :func:`forward_default`."""
        return forward_default(self, batch, kv)

    def max_context_len(self, batch: ForwardBatch) -> int:
        """The step's longest context in tokens (0 for an empty batch). Positions are not
        limited here: the engine admits requests up to its ``max_model_len``
        (``ModelConfig.check_max_model_len``), which may pass the trained length only
        with ``allow_long_context``."""
        return max((s.ctx_len for s in batch.seqs), default=0)

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

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and ``lm_head``: float32 ``[N, vocab]`` for residual rows ``[N, hidden]``."""
        b = self.backend
        return b.linear(b.rms_norm(x, self.norm, self.config.rms_norm_eps),
                        self._lm_head).float()


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
    plans = {w: model.backend.plan_attention(batch.seqs, w, kv, cfg.num_attention_heads,
                                             model.device)
             for w in set(cfg.layer_sliding_windows)}
    for i, layer in enumerate(model.decoder_layers):
        q, k, v = layer.qkv_write(x, cos, sin, kv, i, batch.slot_mapping)
        attn = model.backend.attention(q, k, v, kv, i, plans[cfg.layer_sliding_windows[i]])
        x = layer.finish(x, attn)
    return model.logits(x[batch.logits_indices])
