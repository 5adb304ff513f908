"""The compute backend of a model: every op of the forward pass that has more than one
implementation goes through one object, chosen once at load (``EngineConfig.
compute_backend``, see :func:`prefixcache.model.loader.make_backend`), so the model code
does not know which runs and a new backend is one new module.

:class:`ComputeBackend` is the interface and :class:`TorchBackend` the plain-torch one (the
CUDA path and the reference): attention gathers each sequence's context KV and calls
``scaled_dot_product_attention``, linears are ``F.linear``. The CPU backend with the paged
kernels, fused ops and small GEMM is :class:`prefixcache.model.cpu.backend.CpuKernelBackend`.

Linear layers are prepared once: a model asks :meth:`ComputeBackend.prepare_linear` for a
handle of each weight when it is built (the weight may still be filled in place
afterwards), :meth:`ComputeBackend.finish_linear` after the weights are loaded (the loader
calls ``PagedLlama.prepack``: pack, quantize), and runs :meth:`ComputeBackend.linear` on the
handle. A backend that stores weights packed or quantized keeps them in its handle (a
quantized-linear backend is one subclass overriding these three methods).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefixcache.model.attention import AttentionPlan, paged_attention, plan_attention
from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.rope import apply_rope

# (shape, dtype, device) -> a new uninitialised tensor
Allocator = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


@dataclass
class TorchLinear:
    """:class:`TorchBackend`'s linear handle: ``weight [out, in]``, ``bias [out]`` or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


class ComputeBackend:
    """The ops of one model's forward pass (see the module doc). The base class is the
    plain-torch implementation of each; a backend overrides what it runs otherwise.

    Attributes:
        name: the backend's configuration name (``"torch"``, ``"cpu"``, ``"cpu-kernels"``).
    """

    name = "torch"

    # -- placement ------------------------------------------------------------------
    def weight_allocator(self) -> Allocator:
        """A fresh allocator for one model's weights (``torch.empty``; the CPU backend
        places them on huge pages)."""
        return lambda shape, dtype, device: torch.empty(shape, dtype=dtype, device=device)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
              ) -> torch.Tensor:
        """A zeroed tensor for the KV pool (``torch.zeros``)."""
        return torch.zeros(shape, dtype=dtype, device=device)

    # -- linear layers --------------------------------------------------------------
    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> object:
        """A handle of ``weight [out, in]`` and ``bias [out]`` (or None) for :meth:`linear`.
        The tensors may still be filled in place after this call."""
        return TorchLinear(weight, bias)

    def finish_linear(self, prepared: object) -> bool:
        """Called once the weights are loaded: pack or convert the handle now rather than
        in the first step. Returns whether anything was done."""
        return False

    def linear(self, x: torch.Tensor, prepared: object,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x [N, in] @ weight.T + bias`` ``[N, out]`` in ``x``'s dtype, plus ``residual
        [N, out]`` when given."""
        assert isinstance(prepared, TorchLinear), type(prepared)
        y = F.linear(x, prepared.weight, prepared.bias)
        return y if residual is None else residual + y

    # -- elementwise ----------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dimension, computed in float32, returned in ``x.dtype``
        (a new tensor: ``x`` is never written)."""
        x32 = x.float()
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return (x32 * r).to(x.dtype).mul_(weight)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` ``[N, i]`` for ``gate_up [N, 2 * i]`` (gate columns first)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)

    def rope(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
             head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q ``[N, num_heads, d]`` and k, v ``[N, kv_heads, d]`` of the fused projection
        ``qkv [N, (num_heads + 2 * kv_heads) * d]``, RoPE (``cos``/``sin [N, d]``)
        applied to q and k."""
        d = head_dim
        kv_size = (qkv.shape[-1] - num_heads * d) // 2
        qk, v = qkv.split([num_heads * d + kv_size, kv_size], dim=-1)
        qk = apply_rope(qk.unflatten(-1, (-1, d)), cos, sin)  # q and k together
        q, k = qk.split([num_heads, kv_size // d], dim=1)
        return q, k, v.unflatten(-1, (-1, d))

    def rope_write(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   num_heads: int, head_dim: int, kv: KVPool, layer: int,
                   slot_mapping: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`rope`, and k and v of every row written to ``kv`` layer ``layer`` at
        ``slot_mapping [N]``."""
        q, k, v = self.rope(qkv, cos, sin, num_heads, head_dim)
        kv.write(layer, slot_mapping, k, v)
        return q, k, v

    # -- attention ------------------------------------------------------------------
    def plan_attention(self, seqs: list[SeqChunk], window: int | None, kv: KVPool,
                       num_heads: int, device: torch.device) -> AttentionPlan:
        """A step's attention plan for layers with sliding window ``window`` (tokens or
        None), built once per step and shared by those layers."""
        return plan_attention(seqs, window, device, kv.block_size)

    def attention(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                  kv: KVPool, layer: int, plan: AttentionPlan) -> torch.Tensor:
        """Attention ``[T, heads * d]`` of queries ``q [T, heads, d]`` (RoPE applied)
        over ``plan``; the step's new K/V ``[T, kv_heads, d]`` are already in ``kv``."""
        return paged_attention(q, k_new, v_new, kv, layer, plan)


class TorchBackend(ComputeBackend):
    """Plain torch ops on any device (the CUDA path, and the CPU reference)."""

    name = "torch"
