"""Paged decode attention read in place from the KV pool (CPU), from ``paged_decode.cpp``.

The kernel walks each decode row's page table and reads its keys and values where they
lie in the pool, with an online softmax per page: no gathered copy of the context (the
copy and the padded SDPA were half of a multi-sequence decode step,
``benchmarks/decode/RESULTS.md``). Built with the other CPU kernels (:mod:`.build`).
Used by :mod:`prefixcache.model.cpu.backend` when its ``decode_kernel`` switch is on (off,
attention gathers pages, as on CUDA).
"""
from __future__ import annotations

import torch

from prefixcache.model.cpu.kernels import build

MAX_GROUP, MAX_DIM, MAX_BLOCK = 16, 256, 256  # geometry this path is used for


load = build.load
failure = build.failure


def supports(pool_k: torch.Tensor, num_heads: int) -> bool:
    """Whether the kernel handles a pool layer ``[P, block_size, kv_heads, head_dim]``
    with ``num_heads`` query heads (CPU, float32 or bfloat16, geometry within its
    buffers)."""
    _, bs, kvh, d = pool_k.shape
    return (pool_k.device.type == "cpu" and pool_k.dtype in (torch.float32, torch.bfloat16)
            and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP and d <= MAX_DIM
            and bs <= MAX_BLOCK)


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 page_table: torch.Tensor, ctx_lens: torch.Tensor, window: int | None,
                 scale: float) -> torch.Tensor:
    """Decode attention, ``[B, num_heads, head_dim]`` in ``q``'s dtype.

    Args:
        q: ``[B, num_heads, head_dim]`` queries (RoPE applied), one per row.
        k_pool, v_pool: one layer of the pool, ``[P, block_size, kv_heads, head_dim]``.
        page_table: int64 ``[B, max_pages]`` (rows may be padded past their context).
        ctx_lens: int64 ``[B]`` keys per row (the query's own included), ``>= 1``.
        window: sliding window in tokens (keys ``[ctx - window, ctx)``), or ``None``.
        scale: softmax scale (``head_dim ** -0.5``).

    Raises:
        RuntimeError: the kernel is unavailable (check :func:`load` first), or a page id
            lies outside the pool or a context beyond its page table.
    """
    mod = build.load()
    if mod is None:
        raise RuntimeError(f"paged decode kernel unavailable: {build.failure() or 'disabled'}")
    qf = q.to(torch.float32).contiguous()
    out = torch.empty_like(qf)
    mod.paged_decode(qf, k_pool, v_pool, page_table.contiguous(), ctx_lens.contiguous(),
                     out, -1 if window is None else int(window), float(scale))
    return out.to(q.dtype)
