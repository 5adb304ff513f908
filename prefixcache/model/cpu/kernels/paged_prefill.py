"""Causal prefill attention of one sequence's chunk, read in place from the KV pool (CPU),
from ``paged_prefill.cpp``.

The chunk's queries attend every key of their context, the cached prefix and the chunk's
own keys (written to the pool first), through the page table: no gathered copy, no mask
tensor, one call instead of the two flash calls and merge of
:func:`prefixcache.model.cpu.backend.prefix_split_attention`. The query heads of one KV
head are processed together, so each key is read once for all of them. Built with the
other CPU kernels (:mod:`.build`); used by :mod:`prefixcache.model.cpu.backend` when its
``prefill_kernel`` switch is on.
"""
from __future__ import annotations

import torch

from prefixcache.model.cpu.kernels import build

MAX_GROUP = 48  # query heads per KV head this path is used for (the kernel's 48 lanes)

load = build.load
failure = build.failure


def supports(pool_k: torch.Tensor, num_heads: int) -> bool:
    """Whether the kernel handles a pool layer ``[P, block_size, kv_heads, head_dim]``
    with ``num_heads`` query heads (CPU, float32 or bfloat16, head_dim a multiple of 8,
    at most ``MAX_GROUP`` query heads per KV head)."""
    _, _, kvh, d = pool_k.shape
    return (pool_k.device.type == "cpu" and pool_k.dtype in (torch.float32, torch.bfloat16)
            and num_heads % kvh == 0 and num_heads // kvh <= MAX_GROUP and d % 8 == 0)


def _rows_ok(t: torch.Tensor) -> bool:
    """float32 with each token's heads contiguous (any token stride): the kernel's layout."""
    return (t.dtype == torch.float32 and t.stride(-1) == 1 and t.stride(1) == t.shape[-1]
            and t.stride(0) >= t.shape[1] * t.shape[2])


def paged_prefill(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                  page_table: torch.Tensor, first: int, scale: float,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of a chunk, ``[n, num_heads, head_dim]`` in ``q``'s dtype.

    Args:
        q: ``[n, num_heads, head_dim]`` queries (RoPE applied) at positions
            ``[first, first + n)``; a float32 view whose tokens are strided (a slice of a
            fused q/k tensor) is read in place.
        k_pool, v_pool: one layer of the pool, ``[P, block_size, kv_heads, head_dim]``,
            holding keys ``[0, first + n)`` of the sequence (its own new keys included).
        page_table: int64 ``[pages]`` the sequence's pages (at least ``first + n`` keys).
        first: position of the chunk's first query (the cached or earlier tokens), >= 0.
        scale: softmax scale (``head_dim ** -0.5``).
        out: where to write the result (``q``'s shape; written in place when float32
            with each token's heads contiguous), or ``None`` for a new tensor.

    Raises:
        RuntimeError: the kernel is unavailable (check :func:`load` first), the
            geometry is unsupported, or a page id lies outside the pool or the chunk's
            keys beyond its page table.
    """
    mod = build.load()
    if mod is None:
        raise RuntimeError(f"paged prefill kernel unavailable: {build.failure() or 'disabled'}")
    if q.shape[0] == 0:  # no queries: nothing to attend
        return out if out is not None else torch.empty_like(q)
    qf = q if _rows_ok(q) else q.to(torch.float32).contiguous()
    res = out if out is not None and _rows_ok(out) else torch.empty(
        q.shape, dtype=torch.float32, device=q.device)
    mod.paged_prefill(qf, k_pool, v_pool, page_table.contiguous(), int(first), res,
                      float(scale))
    if out is not None:
        if res is not out:
            out.copy_(res)
        return out
    return res.to(q.dtype)
