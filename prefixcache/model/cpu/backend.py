"""The CPU compute backend: the paged decode and prefill kernels reading KV in place, the
exact fused elementwise ops, the small GEMM of decode steps, oneDNN-prepacked linears,
the prefix split of prefill chunks after a cached prefix, and weights on huge pages.

One :class:`CpuKernelBackend` is chosen per model at load
(:func:`prefixcache.model.loader.make_backend`; ``EngineConfig.compute_backend``
``"cpu-kernels"``, or ``"cpu"`` for the same backend without the C++ kernels). Its
switches are fixed when it is built; A/B benchmarks build two and run the same model on
each (:meth:`prefixcache.model.llama.PagedLlama.set_backend`). Every op returns the bits
of the torch op it replaces (the fused ops are checked at first use; the attention kernels
and the small GEMM agree with torch within float32 rounding, tested).
"""
from __future__ import annotations

import logging

import torch

from prefixcache.model.attention import (
    AttentionPlan,
    decode_group_attention,
    plan_attention,
    seq_attention,
)
from prefixcache.model.backend import Allocator, ComputeBackend
from prefixcache.model.cpu import host_memory
from prefixcache.model.cpu.kernels import build, fused_ops, paged_decode, paged_prefill
from prefixcache.model.cpu.packed_linear import PackedLinear
from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.kv_pool import KVPool

log = logging.getLogger(__name__)

# A chunk after a cached prefix uses prefix_split_attention when new tokens x prefix tokens
# reach this: below it one masked call is faster, above it the split (the crossover is in
# benchmarks/decode/RESULTS.md)
SPLIT_MIN_WORK = 1 << 16
SWITCHES = ("decode_kernel", "prefill_kernel", "fused_ops", "small_gemm", "split_prefix",
            "huge_pages", "pack")


class CpuKernelBackend(ComputeBackend):
    """The CPU backend (see the module doc).

    Args:
        dtype: the model's float type; the fused ops run only for float32.
        kernels: the default of the four kernel switches below: use the C++ kernels
            (built at construction, about 30 s once per machine; if the build fails the
            reason is logged and every kernel switch is off).
        decode_kernel, prefill_kernel: attention reads the KV pages in place (decode
            groups; prefill chunks without a sliding window) instead of gathering them.
        fused_ops: RoPE with the KV write, SiLU times up and RMSNorm's scaling as the exact
            fused ops (float32 only, and only where they return torch's bits here).
        small_gemm: linears of 1-8 rows run the weight-streaming kernel.
        split_prefix: chunks after a cached prefix (no window) attend as two flash calls
            merged by log-sum-exp (:func:`prefix_split_attention`) instead of one masked
            call, from :data:`SPLIT_MIN_WORK`.
        huge_pages: weights are placed on huge-page-advised mappings.
        pack: linears of two rows or more run on oneDNN-prepacked weights.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, kernels: bool = True, *,
                 decode_kernel: bool | None = None, prefill_kernel: bool | None = None,
                 fused_ops: bool | None = None, small_gemm: bool | None = None,
                 split_prefix: bool = True, huge_pages: bool = True, pack: bool = True):
        flag = lambda v: kernels if v is None else v  # noqa: E731
        switches = dict(decode_kernel=flag(decode_kernel), prefill_kernel=flag(prefill_kernel),
                        fused_ops=flag(fused_ops), small_gemm=flag(small_gemm))
        if any(switches.values()) and build.load() is None:
            log.warning("CPU kernels unavailable, the model runs torch ops: %s",
                        (build.failure() or "").splitlines()[0] if build.failure() else "")
            switches = dict.fromkeys(switches, False)
        self.decode_kernel = switches["decode_kernel"]
        self.prefill_kernel = switches["prefill_kernel"]
        self.small_gemm = switches["small_gemm"]
        self.fused_ops = (switches["fused_ops"] and dtype == torch.float32
                          and fused_ops_available())
        self.split_prefix = split_prefix
        self.huge_pages = huge_pages
        self.pack = pack
        self.dtype = dtype
        self.name = "cpu-kernels" if any(switches.values()) else "cpu"

    def replace(self, **changes: bool) -> CpuKernelBackend:
        """A backend like this one with the switches ``changes`` (names in
        :data:`SWITCHES`) changed: the other side of an A/B."""
        unknown = set(changes) - set(SWITCHES)
        if unknown:
            raise ValueError(f"unknown CpuKernelBackend switches: {sorted(unknown)}")
        kw = {k: getattr(self, k) for k in SWITCHES} | changes
        return CpuKernelBackend(self.dtype, **kw)

    def __repr__(self) -> str:
        on = [k for k in SWITCHES if getattr(self, k)]
        return f"CpuKernelBackend({', '.join(on)})"

    # -- placement ------------------------------------------------------------------
    def weight_allocator(self) -> Allocator:
        """Weights on huge pages (:class:`host_memory.HugePageArena`): a one-row decode step
        reads them all."""
        arena = host_memory.HugePageArena() if self.huge_pages else None
        return lambda shape, dtype, device: host_memory.empty(shape, dtype, device, arena)

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str
              ) -> torch.Tensor:
        """The KV pool, resident at once (:func:`host_memory.zeros`)."""
        return host_memory.zeros(shape, dtype, device)

    # -- linear layers --------------------------------------------------------------
    def prepare_linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> object:
        """A :class:`PackedLinear` (packed at :meth:`finish_linear`, or on first use)."""
        return PackedLinear(weight, bias, pack=self.pack)

    def finish_linear(self, prepared: object) -> bool:
        """Pack the oneDNN copy now; False where packing does not apply."""
        assert isinstance(prepared, PackedLinear), type(prepared)
        return prepared.prepack()

    def linear(self, x: torch.Tensor, prepared: object,
               residual: torch.Tensor | None = None) -> torch.Tensor:
        assert isinstance(prepared, PackedLinear), type(prepared)
        return prepared(x, residual, small_gemm=self.small_gemm)

    # -- elementwise ----------------------------------------------------------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if not self.fused_ops:
            return super().rms_norm(x, weight, eps)
        x32 = x.float()
        r = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return fused_ops.rms_apply(x32, r, weight)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        if not self.fused_ops:
            return super().silu_mul(gate_up)
        return fused_ops.silu_mul(gate_up)

    def rope_write(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   num_heads: int, head_dim: int, kv: KVPool, layer: int,
                   slot_mapping: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """With the fused ops, RoPE and the KV write are one pass over ``qkv``, in place."""
        if not self.fused_ops:
            return super().rope_write(qkv, cos, sin, num_heads, head_dim, kv, layer,
                                      slot_mapping)
        d = head_dim
        fused_ops.rope_write(qkv, cos, sin, num_heads, slot_mapping, kv.k[layer], kv.v[layer])
        kv_size = (qkv.shape[-1] - num_heads * d) // 2
        q, k, v = qkv.split([num_heads * d, kv_size, kv_size], dim=-1)
        return (q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)),
                v.unflatten(-1, (-1, d)))

    # -- attention ------------------------------------------------------------------
    def plan_attention(self, seqs: list[SeqChunk], window: int | None, kv: KVPool,
                       num_heads: int, device: torch.device) -> AttentionPlan:
        """Decode groups and prefill chunks planned for the kernels where the pool's
        device, dtype and geometry allow; chunks after a prefix for the split."""
        return plan_attention(
            seqs, window, device, kv.block_size,
            in_place=self.decode_kernel and paged_decode.supports(kv.k[0], num_heads),
            prefill_in_place=(self.prefill_kernel
                              and paged_prefill.supports(kv.k[0], num_heads)),
            split_min_work=(SPLIT_MIN_WORK if self.split_prefix and device.type == "cpu"
                            else None))

    def attention(self, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                  kv: KVPool, layer: int, plan: AttentionPlan) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        scale = q.shape[-1] ** -0.5
        for g in plan.decode:
            if g.mask is None:  # planned for the kernel
                out[g.rows] = paged_decode.paged_decode(
                    q[g.rows], kv.k[layer], kv.v[layer], g.page_table, g.ctx_lens, g.window,
                    scale)
            else:
                decode_group_attention(q, kv, layer, g, out)
        same_dtype = kv.k[layer].dtype == k_new.dtype
        for p in plan.seqs:
            s = p.seq
            rows = slice(s.q_start, s.q_start + s.q_len)
            fresh = s.ctx_len - s.q_len  # first position computed this step
            if p.in_place:
                paged_prefill.paged_prefill(q[rows], kv.k[layer], kv.v[layer], s.page_table,
                                            fresh, scale, out=out[rows])
            elif p.split and same_dtype:
                k, v = kv.gather_range(layer, s.page_table, 0, fresh)
                out[rows] = prefix_split_attention(q[rows], k, v, k_new[rows], v_new[rows])
            else:
                seq_attention(q, k_new, v_new, kv, layer, p, out)
        return out.flatten(1)


def fused_ops_available() -> bool:
    """Whether the fused ops are built and return torch's bits here (checked once)."""
    return fused_ops.available()


def prefix_split_attention(q: torch.Tensor, k_prefix: torch.Tensor, v_prefix: torch.Tensor,
                           k_own: torch.Tensor, v_own: torch.Tensor) -> torch.Tensor:
    """Attention of a prefill chunk after a cached prefix, ``[q_len, heads, d]``, as two
    flash calls merged by their log-sum-exp instead of one call with a ``[q_len, ctx]``
    mask: every query sees the whole prefix (no mask; the query heads of one KV head
    become rows of one call, so no grouped-query expansion) and the chunk's own keys
    causally. Faster than the masked call on long prefixes
    (``benchmarks/decode/RESULTS.md``); equal results up to float rounding.

    Args:
        q: ``[q_len, heads, d]`` (RoPE applied).
        k_prefix, v_prefix: ``[prefix_len, kv_heads, d]``, prefix_len >= 1.
        k_own, v_own: ``[q_len, kv_heads, d]``, the chunk's own keys and values.
    """
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    n, heads, d = q.shape
    kvh = k_prefix.shape[1]
    group = heads // kvh
    qh = q.transpose(0, 1).contiguous()                       # [heads, n, d]
    a, lse_a = flash(qh.view(1, kvh, group * n, d),           # rows (g, i) per KV head
                     k_prefix.transpose(0, 1).unsqueeze(0), v_prefix.transpose(0, 1).unsqueeze(0))
    k_o = k_own.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    v_o = v_own.transpose(0, 1).repeat_interleave(group, 0).unsqueeze(0)
    b, lse_b = flash(qh.unsqueeze(0), k_o, v_o, is_causal=True)
    a, lse_a = a.reshape(heads, n, d), lse_a.reshape(heads, n, 1)
    b, lse_b = b.reshape(heads, n, d), lse_b.reshape(heads, n, 1)
    m = torch.maximum(lse_a, lse_b)
    wa, wb = (lse_a - m).exp_(), (lse_b - m).exp_()
    o = (a.float() * wa + b.float() * wb) / (wa + wb)
    return o.to(q.dtype).transpose(0, 1)


