"""The paged KV pool: one K and one V tensor per layer, addressed by page id.

Shape per layer: ``[num_pages, block_size, num_kv_heads, head_dim]``. Memory in bytes:
``2 * num_layers * num_pages * block_size * num_kv_heads * head_dim * dtype.itemsize``.
Which page belongs to whom is decided by ``prefixcache.cache``; this module only holds
the tensors, and one reused scratch buffer that attention gathers pages into (K and V of
the most pages one layer of a step gathered, rounded up to a power of two).
"""
from __future__ import annotations

import torch


class KVPool:
    """Preallocated KV tensors.

    Args:
        num_layers, num_pages, block_size, num_kv_heads, head_dim: pool geometry.
        dtype: storage dtype (the model's dtype).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
    """

    def __init__(self, num_layers: int, num_pages: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str):
        shape = (num_pages, block_size, num_kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_pages = num_pages
        self.block_size = block_size
        self._scratch: torch.Tensor | None = None  # reused by gather_pages / gather_range
        self.num_scratch_allocs = 0

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """KV bytes one token occupies across all layers (K and V)."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write new tokens' KV. ``k``/``v``: ``[T, num_kv_heads, head_dim]``;
        ``slot_mapping``: int64 ``[T]``."""
        kh, vh = self.k[layer], self.v[layer]
        kh.view(-1, kh.shape[2], kh.shape[3]).index_copy_(0, slot_mapping, k.to(kh.dtype))
        vh.view(-1, vh.shape[2], vh.shape[3]).index_copy_(0, slot_mapping, v.to(vh.dtype))

    def gather(self, layer: int, page_table: torch.Tensor, ctx_len: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions ``[0, ctx_len)`` of one sequence.

        Returns ``(k, v)``, each ``[ctx_len, kv_heads, head_dim]``."""
        kh, vh = self.k[layer], self.v[layer]
        k = kh.index_select(0, page_table).flatten(0, 1)[:ctx_len]
        v = vh.index_select(0, page_table).flatten(0, 1)[:ctx_len]
        return k, v

    def gather_range(self, layer: int, page_table: torch.Tensor, start: int, end: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions ``[start, end)`` of one sequence, each
        ``[end - start, kv_heads, head_dim]`` (copies only the pages that hold them, into
        the scratch buffer of :meth:`gather_pages`: valid until the next gather)."""
        bs = self.block_size
        first, last = start // bs, (end + bs - 1) // bs
        k, v = self.gather_pages(layer, page_table[first:last])
        lo, hi = start - first * bs, end - first * bs
        return k.flatten(0, 1)[lo:hi], v.flatten(0, 1)[lo:hi]

    def gather_pages(self, layer: int, pages: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``pages`` (int64 ``[n]``), each ``[n, block_size, kv_heads,
        head_dim]``, copied into a scratch buffer the pool keeps and reuses (grown to the
        next power of two of pages when too small). Valid until the next
        ``gather_pages`` / ``gather_range`` call: a step's layers gather one after another
        into the same memory instead of allocating (and page-faulting in) fresh copies."""
        n = int(pages.numel())
        kh = self.k[layer]
        if self._scratch is None or self._scratch.shape[1] < n:
            cap = 1 << max(0, n - 1).bit_length()
            self._scratch = torch.empty((2, cap, *kh.shape[1:]), dtype=kh.dtype,
                                        device=kh.device)
            self.num_scratch_allocs += 1
        k, v = self._scratch[0, :n], self._scratch[1, :n]
        torch.index_select(kh, 0, pages, out=k)
        torch.index_select(self.v[layer], 0, pages, out=v)
        return k, v
