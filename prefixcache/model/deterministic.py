"""Deterministic mode: batch-invariant arithmetic over fixed-shape page tiles.

Goal: a token's KV and logits are bit-identical whatever else is in the batch, however its
prefill was chunked, whether its prefix came from the cache, and whether it was computed
in prefill or in decode. Floating-point kernels give bit-identical results for a row only
when called with the same shapes, so every token is computed in a shape that depends on
its position alone:

* Each new token sits in a **tile** of exactly ``block_size`` rows, one tile per (sequence,
  page), at row ``position % block_size``. Rows of the page that are not new this step are
  zero padding and write no KV.
* Every linear layer, norm and RoPE runs on one tile at a time (``[block_size, hidden]``),
  never on a batch of tiles (a GEMM's row results may depend on its row count).
* Attention of a tile: its ``block_size`` queries against keys ``[key_lo, page_end)``
  (``page_end = (page_index + 1) * block_size``; ``key_lo`` is 0, or page-aligned under a
  sliding window), with a per-row mask: a row at position ``p`` sees keys ``<= p`` (and
  ``> p - window``). Padding rows past the context see all written keys, so no row is
  ever fully masked. Keys at positions ``>= ctx_len`` are stale page contents: masked,
  and also zeroed in the gathered copy, so stale garbage (even NaN) never matters.
* Per layer, every tile first writes its K/V, then every tile attends; tiles of a sequence
  are in page order, so page ``k`` of layer ``l`` is written before page ``k + 1`` reads it.
* The final norm and ``lm_head`` run on each requested row alone, copied to a fresh
  ``[1, hidden]`` tensor: also a fixed shape (and alignment), at 1/``block_size`` of the
  cost of running the whole tile through ``lm_head``.
* RoPE tables are built in fixed-size blocks (see :mod:`prefixcache.model.rope`).

Cost: a decode token pays the matmuls of a whole tile (``block_size`` rows), and every
tile runs its own small kernels (about 40 per layer), so overhead grows with the number
of tiles (figures: ``scripts/model_forward_perf.py``, ``benchmarks/``). The bits depend on
the device, dtype, torch build and thread count: runs agree on one machine configuration,
not across machines.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefixcache.model.forward_batch import ForwardBatch, SeqChunk
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.llama import PagedLlama


@dataclass
class Tile:
    """New tokens of one sequence inside one page.

    Attributes:
        seq: the sequence's chunk.
        page_index: index of the page in the sequence (positions ``page_index *
            block_size + [0, block_size)``).
        lo, hi: tile rows ``[lo, hi)`` hold this step's new tokens.
        row: flattened batch row of tile row ``lo``.
    """

    seq: SeqChunk
    page_index: int
    lo: int
    hi: int
    row: int


def plan_tiles(seqs: list[SeqChunk], block_size: int) -> list[Tile]:
    """Tiles of a step in row order (sequences in order, pages in order)."""
    tiles = []
    for s in seqs:
        first = s.ctx_len - s.q_len
        for page in range(first // block_size, (s.ctx_len - 1) // block_size + 1):
            start = max(first, page * block_size)
            end = min(s.ctx_len, (page + 1) * block_size)
            tiles.append(Tile(s, page, start - page * block_size, end - page * block_size,
                              s.q_start + start - first))
    return tiles


def _tile_mask(tile: Tile, block_size: int, key_lo: int, window: int | None,
               device: torch.device) -> torch.Tensor:
    """bool ``[block_size, page_end - key_lo]``: True where a tile row may attend."""
    page_start = tile.page_index * block_size
    q_pos = torch.arange(page_start, page_start + block_size, device=device).unsqueeze(1)
    k_pos = torch.arange(key_lo, page_start + block_size, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    # Padding rows past the context see every written key: never an empty (NaN) row.
    written = k_pos < tile.seq.ctx_len
    return torch.where(q_pos < tile.seq.ctx_len, mask, written)


def _key_lo(page_index: int, block_size: int, window: int | None) -> int:
    """First key position a tile reads: page-aligned, a function of the page alone."""
    if window is None:
        return 0
    return max(0, page_index * block_size - window + 1) // block_size * block_size


def _tile_attention(q: torch.Tensor, kv: KVPool, layer: int, tile: Tile, key_lo: int,
                    mask: torch.Tensor) -> torch.Tensor:
    """Attention ``[block_size, heads * d]`` of tile queries ``q [block_size, heads, d]``."""
    bs = kv.block_size
    page_end = (tile.page_index + 1) * bs
    k, v = kv.gather_range(layer, tile.seq.page_table, key_lo, page_end)
    stale = tile.seq.ctx_len - key_lo
    if stale < k.shape[0]:
        k[stale:] = 0
        v[stale:] = 0
    k, v = k.to(q.dtype), v.to(q.dtype)  # no-ops unless the pool has another dtype
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
        v.transpose(0, 1).unsqueeze(0), attn_mask=mask, enable_gqa=True)
    return o[0].transpose(0, 1).flatten(1)


@torch.inference_mode()
def forward_deterministic(model: PagedLlama, batch: ForwardBatch, kv: KVPool
                          ) -> torch.Tensor:
    """Batch-invariant sibling of :func:`prefixcache.model.llama.forward_default`: same
    inputs and outputs (float32 logits ``[len(batch.logits_indices), vocab]``), see the
    module doc.

    Reads ``batch.logits_indices`` on the host (one small device-to-host copy).

    """
    bs, dev, cfg = kv.block_size, model.device, model.config
    if not batch.seqs:
        return torch.empty(0, cfg.vocab_size, device=dev)
    tiles = plan_tiles(batch.seqs, bs)
    tile_slot = [i * bs + r for i, t in enumerate(tiles) for r in range(t.lo, t.hi)]
    x = torch.zeros(len(tiles) * bs, cfg.hidden_size, device=dev, dtype=model.dtype)
    x[torch.tensor(tile_slot, device=dev)] = model.embed_tokens(batch.input_ids)
    x = x.view(len(tiles), bs, cfg.hidden_size)
    end = max(t.page_index + 1 for t in tiles) * bs
    ropes = {}  # id(RotaryEmbedding) -> per tile (cos, sin)
    for r in {id(r): r for r in (model.rope, model.local_rope)}.values():  # one unless Gemma 3
        cos, sin = r.table(end)
        ropes[id(r)] = [(cos[p:p + bs].to(model.dtype), sin[p:p + bs].to(model.dtype))
                        for p in (t.page_index * bs for t in tiles)]
    windows = cfg.layer_sliding_windows
    attn_geometry = {}  # window -> per tile (key_lo, mask)
    for w in set(windows):
        los = [_key_lo(t.page_index, bs, w) for t in tiles]
        attn_geometry[w] = [(lo, _tile_mask(t, bs, lo, w, dev)) for lo, t in zip(los, tiles)]

    for i, layer in enumerate(model.decoder_layers):
        queries = []
        rope = ropes[id(model.layer_ropes[i])]
        for j, t in enumerate(tiles):
            q, k, v = layer.qkv(x[j], *rope[j])
            kv.write(i, batch.slot_mapping[t.row:t.row + t.hi - t.lo], k[t.lo:t.hi], v[t.lo:t.hi])
            queries.append(q)
        for j, t in enumerate(tiles):
            key_lo, mask = attn_geometry[windows[i]][j]
            x[j] = layer.finish(x[j], _tile_attention(queries[j], kv, i, t, key_lo, mask))

    flat = x.view(-1, cfg.hidden_size)
    rows = [model.logits(flat[tile_slot[r]:tile_slot[r] + 1].clone())
            for r in batch.logits_indices.tolist()]
    if not rows:
        return torch.empty(0, cfg.vocab_size, device=dev)
    return torch.cat(rows)
