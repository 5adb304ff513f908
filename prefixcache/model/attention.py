"""Paged attention of one step (default mode): per sequence, the new queries against the
sequence's context KV gathered through its page table, with
``torch.nn.functional.scaled_dot_product_attention``.

A step's mask plan is built once (on the device) and shared by every layer with the same
sliding window.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.kv_pool import KVPool


@dataclass
class SeqAttention:
    """How one sequence attends in one step.

    Attributes:
        seq: the sequence's chunk (rows ``[q_start, q_start + q_len)``).
        key_start: first key position read (``> 0`` only when a sliding window hides older
            keys); keys ``[key_start, ctx_len)`` are gathered.
        causal: the chunk starts at position 0 and attends causally (no explicit mask).
        mask: bool ``[q_len, ctx_len - key_start]`` (True = attend) or ``None``.
    """

    seq: SeqChunk
    key_start: int
    causal: bool
    mask: torch.Tensor | None


def plan_attention(seqs: list[SeqChunk], window: int | None, device: torch.device
                   ) -> list[SeqAttention]:
    """Masks of a step for layers with attention window ``window`` (tokens, or ``None``).

    The query at position ``p`` sees keys ``j`` with ``j <= p`` and, with a window,
    ``j > p - window``.
    """
    plans = []
    for s in seqs:
        first = s.ctx_len - s.q_len  # position of the first new token
        key_start = 0 if window is None else max(0, first - window + 1)
        if s.q_len == 1 or (window is None and first == 0):
            # one query sees every gathered key; or plain causal from position 0
            plans.append(SeqAttention(s, key_start, s.q_len > 1, None))
            continue
        q_pos = torch.arange(first, s.ctx_len, device=device).unsqueeze(1)
        k_pos = torch.arange(key_start, s.ctx_len, device=device).unsqueeze(0)
        mask = k_pos <= q_pos
        if window is not None:
            mask &= k_pos > q_pos - window
        plans.append(SeqAttention(s, key_start, False, mask))
    return plans


def paged_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: KVPool,
                    layer: int, plans: list[SeqAttention]) -> torch.Tensor:
    """Attention output ``[T, num_heads * head_dim]`` for queries ``q [T, num_heads,
    head_dim]`` (RoPE applied). The step's new KV (``k_new``/``v_new [T, kv_heads,
    head_dim]``) must already be written to ``kv``; a sequence whose keys are all new
    this step reads them directly instead of gathering them back from the pool.
    Grouped-query attention: query head ``h`` reads KV head ``h // (num_heads / kv_heads)``.
    """
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    same_dtype = kv.k[layer].dtype == k_new.dtype
    for p in plans:
        s = p.seq
        rows = slice(s.q_start, s.q_start + s.q_len)
        fresh = s.ctx_len - s.q_len  # first position computed this step
        if same_dtype and p.key_start >= fresh:
            k = k_new[s.q_start + p.key_start - fresh:rows.stop]
            v = v_new[s.q_start + p.key_start - fresh:rows.stop]
        else:
            k, v = kv.gather_range(layer, s.page_table, p.key_start, s.ctx_len)
            k, v = k.to(q.dtype), v.to(q.dtype)  # no-ops unless the pool has another dtype
        o = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1).unsqueeze(0),     # [1, heads, q_len, d]
            k.transpose(0, 1).unsqueeze(0),           # [1, kv_heads, keys, d]
            v.transpose(0, 1).unsqueeze(0),
            attn_mask=p.mask, is_causal=p.causal, enable_gqa=True)
        out[rows] = o[0].transpose(0, 1)
    return out.flatten(1)
