"""The paged KV pool: one K and one V tensor per layer, addressed by page id.

Shape per layer: ``[num_pages, block_size, num_kv_heads, row]``, ``row = head_dim`` for a
float pool (float32, bfloat16, float16). Memory in bytes: ``2 * num_layers * num_pages *
block_size * num_kv_heads * row * itemsize`` (:meth:`KVPool.bytes_per_token`).
Which page belongs to whom is decided by ``prefixcache.cache``; this module only holds
the tensors, and one reused scratch buffer that attention gathers pages into (K and V of
the most pages one layer of a step gathered, rounded up to a power of two).
:meth:`KVPool.export_pages` / :meth:`KVPool.import_pages` are the one way page contents
leave and enter the pool (the KV tiers below it); :meth:`KVPool.copy_pages` copies pages
inside it.

An **int8 pool** (``dtype=torch.int8``, ``--kv-cache-dtype int8``) stores the K (and V) of
one token and KV head as ``head_dim`` int8 codes followed by the 4 bytes of its float32
scale (``row = head_dim + 4``): symmetric absmax quantization per (token, KV head),
``scale = max|x| / 127``, ``code = round(x / scale)``, so ``|x - code * scale| <= scale / 2
= max|x| / 254`` (plus float32 rounding). The scale is per token, not per page: a page
filled token by token (decode) never requantizes what it holds, and a token's codes depend
on its own K/V alone, so cold and warm runs write the same bytes however they are chunked.
Codes and scales share one tensor, so exporting, importing and copying pages (the tiers,
copy on write) carry both unchanged. :meth:`KVPool.write` quantizes; the gathers
(:meth:`KVPool.gather`, :meth:`KVPool.gather_range`, :meth:`KVPool.gather_pages`) return
float32 K/V dequantized (``code * scale``).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

SCALE_BYTES = 4  # an int8 pool's float32 scale, after each row's codes



class KVPool:
    """Preallocated KV tensors.

    Args:
        num_layers, num_pages, block_size, num_kv_heads, head_dim: pool geometry.
        dtype: storage dtype: a float dtype, or ``torch.int8`` (codes and scales, see the
            module doc; ``head_dim`` must then be a multiple of 4).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
        zeros: ``(shape, dtype, device) -> zeroed tensor``, the allocator of the pool's
            layers (the model's compute backend's, :meth:`ComputeBackend.zeros`; default
            ``torch.zeros``).
    """

    def __init__(self, num_layers: int, num_pages: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device | str,
                 zeros: Callable[[tuple[int, ...], torch.dtype, torch.device | str],
                                 torch.Tensor] | None = None):
        self.quantized = dtype == torch.int8
        if self.quantized and head_dim % SCALE_BYTES:
            raise ValueError(f"head_dim: an int8 KV pool needs a multiple of {SCALE_BYTES}, "
                             f"got {head_dim}")
        self.head_dim = head_dim
        row = head_dim + SCALE_BYTES if self.quantized else head_dim
        shape = (num_pages, block_size, num_kv_heads, row)
        if zeros is None:
            zeros = lambda shape, dtype, device: torch.zeros(shape, dtype=dtype,  # noqa: E731
                                                             device=device)
        self.k = [zeros(shape, dtype, device) for _ in range(num_layers)]
        self.v = [zeros(shape, dtype, device) for _ in range(num_layers)]
        self.num_pages = num_pages
        self.block_size = block_size
        self.dtype = dtype
        self.device = torch.device(device)
        self._scratch: torch.Tensor | None = None  # reused by gather_pages / gather_range
        self.num_scratch_allocs = 0

    @property
    def page_shape(self) -> tuple[int, ...]:
        """Shape of one exported page: ``(2, num_layers, block_size, num_kv_heads, row)``
        (K then V, layer by layer; ``row`` is ``head_dim``, or ``head_dim + 4`` bytes of
        codes and scale in an int8 pool)."""
        k = self.k[0]
        return (2, len(self.k), k.shape[1], k.shape[2], k.shape[3])

    def export_pages(self, page_ids: list[int]) -> torch.Tensor:
        """Copy pages out of the pool: ``[len(page_ids), *page_shape]`` on the pool's
        device, contiguous (page-major, so each page's bytes are one run).

        Raises:
            ValueError: ``page_ids`` is empty or holds an id outside ``[0, num_pages)``."""
        idx = self._index(page_ids)
        out = torch.empty((len(page_ids), *self.page_shape), dtype=self.dtype,
                          device=self.device)
        for layer, (kh, vh) in enumerate(zip(self.k, self.v)):
            out[:, 0, layer] = kh.index_select(0, idx)
            out[:, 1, layer] = vh.index_select(0, idx)
        return out

    def import_pages(self, page_ids: list[int], data: torch.Tensor) -> None:
        """Write pages' contents (from :meth:`export_pages`, possibly on another device or
        after a round trip through bytes) into pool pages ``page_ids``.

        Raises:
            ValueError: bad ``page_ids``, or ``data`` is not ``[len(page_ids), *page_shape]``
                of the pool's dtype."""
        idx = self._index(page_ids)
        if tuple(data.shape) != (len(page_ids), *self.page_shape) or data.dtype != self.dtype:
            raise ValueError(f"data: expected {(len(page_ids), *self.page_shape)} "
                             f"{self.dtype}, got {tuple(data.shape)} {data.dtype}")
        data = data.to(self.device, non_blocking=True)
        for layer, (kh, vh) in enumerate(zip(self.k, self.v)):
            kh.index_copy_(0, idx, data[:, 0, layer])
            vh.index_copy_(0, idx, data[:, 1, layer])

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy the contents of pages ``src[i]`` into pages ``dst[i]`` on the pool's
        device, every layer, K and V (copy on write of a shared partial page: the
        parallel samples of one prompt). Queued on the current stream, so it runs
        before any later step reads or writes those pages.

        Raises:
            ValueError: the lists differ in length, hold a bad id, or overlap."""
        if len(src) != len(dst) or set(src) & set(dst):
            raise ValueError(f"copy_pages: need equally long, disjoint src and dst, got "
                             f"{src} and {dst}")
        s, d = self._index(src), self._index(dst)
        for kh, vh in zip(self.k, self.v):
            kh.index_copy_(0, d, kh.index_select(0, s))
            vh.index_copy_(0, d, vh.index_select(0, s))

    def _index(self, page_ids: list[int]) -> torch.Tensor:
        if not page_ids or min(page_ids) < 0 or max(page_ids) >= self.num_pages:
            raise ValueError(f"page_ids: need ids in [0, {self.num_pages}), got {page_ids}")
        return torch.tensor(page_ids, dtype=torch.long, device=self.device)

    @property
    def dtype_name(self) -> str:
        """The storage dtype's name as torch prints it, no prefix (``"float32"``,
        ``"bfloat16"``, ``"int8"``): the tiers' page format names it."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def page_nbytes(self) -> int:
        """Bytes of one exported page (:attr:`page_shape` elements of the pool's dtype)."""
        n = 1
        for d in self.page_shape:
            n *= d
        return n * self.k[0].element_size()

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        """KV bytes one token occupies across all layers (K and V): ``head_dim`` elements
        of ``dtype`` per KV head, or ``head_dim + 4`` bytes for ``torch.int8``."""
        if dtype == torch.int8:
            return 2 * num_layers * num_kv_heads * (head_dim + SCALE_BYTES)
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * num_kv_heads * head_dim * itemsize

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> None:
        """Write new tokens' KV (quantized in an int8 pool). ``k``/``v``: ``[T,
        num_kv_heads, head_dim]``; ``slot_mapping``: int64 ``[T]``."""
        kh, vh = self.k[layer], self.v[layer]
        if self.quantized:
            k, v = quantize_rows(k), quantize_rows(v)
        kh.view(-1, kh.shape[2], kh.shape[3]).index_copy_(0, slot_mapping, k.to(kh.dtype))
        vh.view(-1, vh.shape[2], vh.shape[3]).index_copy_(0, slot_mapping, v.to(vh.dtype))

    def readable(self, raw: torch.Tensor) -> torch.Tensor:
        """Pool rows ``[..., row]`` as K/V ``[..., head_dim]``: dequantized (a new float32
        tensor) in an int8 pool, ``raw`` itself otherwise."""
        return dequantize_rows(raw, self.head_dim) if self.quantized else raw

    def gather(self, layer: int, page_table: torch.Tensor, ctx_len: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions ``[0, ctx_len)`` of one sequence.

        Returns ``(k, v)``, each ``[ctx_len, kv_heads, head_dim]`` (float32 from an int8
        pool)."""
        kh, vh = self.k[layer], self.v[layer]
        k = kh.index_select(0, page_table).flatten(0, 1)[:ctx_len]
        v = vh.index_select(0, page_table).flatten(0, 1)[:ctx_len]
        return self.readable(k), self.readable(v)

    def gather_range(self, layer: int, page_table: torch.Tensor, start: int, end: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """KV of positions ``[start, end)`` of one sequence, each
        ``[end - start, kv_heads, head_dim]`` (copies only the pages that hold them, into
        the scratch buffer of :meth:`gather_pages`: valid until the next gather)."""
        bs = self.block_size
        first, last = start // bs, (end + bs - 1) // bs
        k, v = self.gather_pages(layer, page_table[first:last])
        lo, hi = start - first * bs, end - first * bs
        return k.flatten(0, 1)[lo:hi], v.flatten(0, 1)[lo:hi]  # already readable

    def gather_pages(self, layer: int, pages: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``pages`` (int64 ``[n]``), each ``[n, block_size, kv_heads,
        head_dim]``, copied into a scratch buffer the pool keeps and reuses (grown to the
        next power of two of pages when too small). Valid until the next
        ``gather_pages`` / ``gather_range`` call: a step's layers gather one after another
        into the same memory instead of allocating (and page-faulting in) fresh copies.
        An int8 pool returns new float32 tensors dequantized from the scratch."""
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
        return self.readable(k), self.readable(v)


def quantize_rows(x: torch.Tensor) -> torch.Tensor:
    """int8 rows ``[..., d + 4]`` of float ``x [..., d]``: per row (one token and KV head)
    the codes ``round(x / scale)`` in ``[-127, 127]``, then the bytes of the float32
    ``scale = max|x| / 127`` (0 for an all-zero row, whose codes are 0)."""
    x32 = x.float()
    scale = x32.abs().amax(-1, keepdim=True) / 127.0
    codes = torch.round(x32 / torch.where(scale > 0, scale, 1.0)).clamp_(-127, 127)
    return torch.cat([codes.to(torch.int8), scale.view(torch.int8)], dim=-1)


def dequantize_rows(raw: torch.Tensor, head_dim: int) -> torch.Tensor:
    """float32 ``[..., head_dim]`` of int8 rows ``[..., head_dim + 4]`` from
    :func:`quantize_rows`: ``code * scale``."""
    scale = raw[..., head_dim:].contiguous().view(torch.float32)
    return raw[..., :head_dim].to(torch.float32) * scale
