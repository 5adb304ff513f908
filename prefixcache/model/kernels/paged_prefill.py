"""Causal prefill attention of one sequence's chunk, read in place from the KV pool (CPU),
from ``paged_prefill.cpp``.

The chunk's queries attend every key of their context, the cached prefix and the chunk's
own keys (written to the pool first), through the page table: no gathered copy, no mask
tensor, one call instead of the two flash calls and merge of
:func:`prefixcache.model.attention.prefix_split_attention`. The query heads of one KV
head are processed together, so each key is read once for all of them. Built with the
other CPU kernels (:mod:`.build`); ``PREFIXCACHE_PREFILL_KERNEL=0`` turns this one off
(attention then runs torch's SDPA, as on CUDA).
"""
from __future__ import annotations

import os

import torch

from prefixcache.model.kernels import build

MAX_GROUP = 48  # query heads per KV head this path is used for (the kernel's 48 lanes)

load = build.load
failure = build.failure


def enabled() -> bool:
    """Whether the kernel may be used (``PREFIXCACHE_PREFILL_KERNEL`` and
    ``PREFIXCACHE_CPU_KERNELS`` are not ``0``)."""
    return os.environ.get("PREFIXCACHE_PREFILL_KERNEL", "1") != "0" and build.enabled()


def supports(pool_k: torch.Tensor, num_heads: int) -> bool:
    """Whether the kernel handles a pool layer ``[P, block_size, kv_heads, head_dim]``
    with ``num_heads`` query heads (CPU, float32 or bfloat16, head_dim a multiple of 8,
    at most ``MAX_GROUP`` query heads per KV head)."""
    _, _, kvh, d = pool_k.shape
    return (pool_k.device.type == "cpu" and pool_k.dtype in (torch.float32, torch.bfloat16)
            and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP and d % 8 == 0)


def paged_prefill(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                  page_table: torch.Tensor, first: int, scale: float) -> torch.Tensor:
    """Causal attention of a chunk, ``[n, num_heads, head_dim]`` in ``q``'s dtype.

    Args:
        q: ``[n, num_heads, head_dim]`` queries (RoPE applied) at positions
            ``[first, first + n)``.
        k_pool, v_pool: one layer of the pool, ``[P, block_size, kv_heads, head_dim]``,
            holding keys ``[0, first + n)`` of the sequence (its own new keys included).
        page_table: int64 ``[pages]`` the sequence's pages (at least ``first + n`` keys).
        first: position of the chunk's first query (the cached or earlier tokens), >= 0.
        scale: softmax scale (``head_dim ** -0.5``).

    Raises:
        RuntimeError: the kernel is unavailable (check :func:`load` first), the
            geometry is unsupported, or a page id lies outside the pool or the chunk's
            keys beyond its page table.
    """
    mod = build.load()
    if mod is None:
        raise RuntimeError(f"paged prefill kernel unavailable: {build.failure() or 'disabled'}")
    qf = q.to(torch.float32).contiguous()
    out = torch.empty_like(qf)
    mod.paged_prefill(qf, k_pool, v_pool, page_table.contiguous(), int(first), out,
                      float(scale))
    return out.to(q.dtype)
