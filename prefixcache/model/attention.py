"""Paged attention of one step (default mode): planning, and the plain-torch path.

Decode tokens (one query each) are batched: the decoding sequences of a step are split,
longest first, into groups of similar length (padding a group's page tables to its
longest adds at most ``PAD_SLACK`` of the pages it holds, so one long context does not
make every short one gather as many pages). Here a group's pages are gathered in one
``index_select`` and one SDPA call masks each row's keys beyond its context.

Prefill chunks attend one sequence at a time (their shapes differ too much to pad
cheaply): from position 0, causal SDPA over their own keys; otherwise SDPA over the
gathered context with a ``[q_len, ctx]`` mask.

A step's plan (masks, padded page tables) is built once (on the device) and shared by
every layer with the same sliding window. The CPU backend
(:mod:`prefixcache.model.cpu.backend`) plans some groups and chunks for its kernels
(read in place) or for the prefix split, and runs the rest through this module.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
        split: a chunk after a cached prefix (new x prefix tokens >= the plan's ``split_min_work``),
            no window: attended by
            :func:`prefix_split_attention` (no mask is built; :func:`causal_mask` gives
            it where that path cannot serve).
        in_place: a chunk of two tokens or more, no window, read in place by the prefill
            kernel (no mask is built).
    """

    seq: SeqChunk
    key_start: int
    causal: bool
    mask: torch.Tensor | None
    split: bool = False
    in_place: bool = False


@dataclass
class DecodeGroup:
    """Decode rows of several sequences attended in one batched call.

    Attributes:
        rows: int64 ``[B]`` query rows in the step.
        page_table: int64 ``[B, P]`` page tables padded (with each row's first page) to
            the longest, ``P`` pages.
        mask: bool ``[B, 1, 1, P * block_size]``: True where the row attends; ``None`` when
            the group is read in place by the decode kernel (which needs only ``ctx_lens``
            and ``window``).
        ctx_lens: int64 ``[B]`` keys each row attends (its own included).
        window: the layers' sliding window in tokens, or ``None``.
    """

    rows: torch.Tensor
    page_table: torch.Tensor
    mask: torch.Tensor | None
    ctx_lens: torch.Tensor
    window: int | None = None


@dataclass
class AttentionPlan:
    """A step's attention for layers of one window: ``seqs`` attend one at a time, each
    of ``decode`` in one call."""

    seqs: list[SeqAttention]
    decode: list[DecodeGroup] = field(default_factory=list)

    @property
    def decode_pages_gathered(self) -> int:
        """Pages each layer gathers for the decode groups (padding included)."""
        return sum(g.page_table.numel() for g in self.decode)


PAD_SLACK = 0.25


def decode_groups(seqs: list[SeqChunk]) -> list[list[SeqChunk]]:
    """``seqs`` split into groups, longest page table first: a sequence joins the current
    group while padding every table of it to its longest adds at most ``PAD_SLACK`` of
    the pages the group holds."""
    groups: list[list[SeqChunk]] = []
    held = 0
    for s in sorted(seqs, key=lambda s: -len(s.page_table)):
        n = len(s.page_table)
        if groups and (len(groups[-1]) + 1) * len(groups[-1][0].page_table) <= (
                1 + PAD_SLACK) * (held + n):
            groups[-1].append(s)
            held += n
        else:
            groups.append([s])
            held = n
    return groups


def _plan_decode(seqs: list[SeqChunk], window: int | None, block_size: int,
                 device: torch.device, in_place: bool) -> DecodeGroup:
    pages = max(len(s.page_table) for s in seqs)
    table = torch.stack([
        torch.cat([s.page_table, s.page_table[:1].expand(pages - len(s.page_table))])
        for s in seqs])
    ctx_lens = torch.tensor([s.ctx_len for s in seqs], device=device)
    rows = torch.tensor([s.q_start for s in seqs], device=device)
    if in_place:
        return DecodeGroup(rows, table, None, ctx_lens, window)
    ctx = ctx_lens.view(-1, 1)
    k_pos = torch.arange(pages * block_size, device=device).view(1, -1)
    mask = k_pos < ctx
    if window is not None:
        mask &= k_pos > ctx - 1 - window
    return DecodeGroup(rows, table, mask.view(len(seqs), 1, 1, -1), ctx_lens, window)


def plan_attention(seqs: list[SeqChunk], window: int | None, device: torch.device,
                   block_size: int | None = None, in_place: bool = False,
                   prefill_in_place: bool = False, split_min_work: int | None = None
                   ) -> AttentionPlan:
    """Masks of a step for layers with attention window ``window`` (tokens, or ``None``).

    The query at position ``p`` sees keys ``j`` with ``j <= p`` and, with a window,
    ``j > p - window``. With ``block_size`` given, the decode rows of sequences whose
    keys are not all new are batched (:class:`DecodeGroup` per :func:`decode_groups`,
    even for one sequence: its grouped-query layout is faster than ``enable_gqa``).
    ``in_place``: the step's decode groups are read by a kernel in place (the CPU
    backend's), so their gather masks are not built. ``prefill_in_place``: chunks of two
    tokens or more are read by a prefill kernel in place when there is no window.
    ``split_min_work``: a chunk after a cached prefix, no window, with new tokens x prefix
    tokens at least this, is planned ``split`` (no mask built); None: never.
    """
    decode = [s for s in seqs if s.q_len == 1 and s.ctx_len > 1]
    groups = []
    if block_size is not None and decode:
        groups = [_plan_decode(g, window, block_size, device, in_place)
                  for g in decode_groups(decode)]
        batched = {id(s) for s in decode}
        seqs = [s for s in seqs if id(s) not in batched]
    plans = []
    for s in seqs:
        first = s.ctx_len - s.q_len  # position of the first new token
        key_start = 0 if window is None else max(0, first - window + 1)
        if prefill_in_place and window is None and s.q_len > 1:
            plans.append(SeqAttention(s, 0, False, None, in_place=True))
            continue
        if s.q_len == 1 or (window is None and first == 0):
            # one query sees every gathered key; or plain causal from position 0
            plans.append(SeqAttention(s, key_start, s.q_len > 1, None))
            continue
        if (window is None and split_min_work is not None
                and s.q_len * first >= split_min_work):
            plans.append(SeqAttention(s, 0, False, None, split=True))
            continue
        plans.append(SeqAttention(s, key_start, False, causal_mask(s, key_start, window,
                                                                  device)))
    return AttentionPlan(plans, groups)


def causal_mask(s: SeqChunk, key_start: int, window: int | None, device: torch.device
                ) -> torch.Tensor:
    """bool ``[q_len, ctx_len - key_start]``: True where chunk ``s``'s query at position
    ``p`` sees key ``j`` (``j <= p``, and ``j > p - window`` with a window)."""
    first = s.ctx_len - s.q_len
    q_pos = torch.arange(first, s.ctx_len, device=device).unsqueeze(1)
    k_pos = torch.arange(key_start, s.ctx_len, device=device).unsqueeze(0)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def paged_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: KVPool,
                    layer: int, plan: AttentionPlan) -> torch.Tensor:
    """Attention output ``[T, num_heads * head_dim]`` for queries ``q [T, num_heads,
    head_dim]`` (RoPE applied), gathering each sequence's context KV from its pages. The
    step's new KV (``k_new``/``v_new [T, kv_heads, head_dim]``) must already be written to
    ``kv``; a sequence whose keys are all new this step reads them directly instead of
    gathering them back from the pool. Grouped-query attention: query head ``h`` reads KV
    head ``h // (num_heads / kv_heads)``. The plan must have been built without kernels
    (every decode group has its mask).
    """
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    for g in plan.decode:
        decode_group_attention(q, kv, layer, g, out)
    for p in plan.seqs:
        seq_attention(q, k_new, v_new, kv, layer, p, out)
    return out.flatten(1)


def seq_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, kv: KVPool,
                  layer: int, p: SeqAttention, out: torch.Tensor) -> None:
    """One sequence's attention by SDPA over its gathered keys (or its own new keys when
    all are new): writes its rows of ``out [T, heads, d]``. A ``split`` plan runs here as
    one call with a causal mask over the whole context."""
    s = p.seq
    rows = slice(s.q_start, s.q_start + s.q_len)
    fresh = s.ctx_len - s.q_len  # first position computed this step
    if kv.k[layer].dtype == k_new.dtype and p.key_start >= fresh:
        k = k_new[s.q_start + p.key_start - fresh:rows.stop]
        v = v_new[s.q_start + p.key_start - fresh:rows.stop]
    else:
        k, v = kv.gather_range(layer, s.page_table, p.key_start, s.ctx_len)
        k, v = k.to(q.dtype), v.to(q.dtype)  # no-ops unless the pool has another dtype
    o = F.scaled_dot_product_attention(
        q[rows].transpose(0, 1).unsqueeze(0),     # [1, heads, q_len, d]
        k.transpose(0, 1).unsqueeze(0),           # [1, kv_heads, keys, d]
        v.transpose(0, 1).unsqueeze(0),
        attn_mask=causal_mask(s, 0, None, q.device) if p.split else p.mask,
        is_causal=p.causal, enable_gqa=True)
    out[rows] = o[0].transpose(0, 1)


def decode_group_attention(q: torch.Tensor, kv: KVPool, layer: int, g: DecodeGroup,
                      out: torch.Tensor) -> None:
    """One SDPA call for a :class:`DecodeGroup` (gathered pages, masked); writes its rows
    of ``out [T, heads, d]``."""
    b, pages = g.page_table.shape
    k, v = kv.gather_pages(layer, g.page_table.reshape(-1))
    # [B * P, bs, kvh, d] -> [B, kvh, P * bs, d]
    k = k.view(b, pages * k.shape[1], k.shape[2], k.shape[3])
    v = v.view(b, pages * v.shape[1], v.shape[2], v.shape[3])
    k, v = k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype)
    # GQA without enable_gqa: the query heads sharing a KV head become that head's query
    # rows ([B, kvh, heads // kvh, d]); faster than enable_gqa on CPU.
    qg = q[g.rows].view(b, k.shape[1], -1, q.shape[-1])
    o = F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask)  # [B, kvh, group, d]
    out[g.rows] = o.reshape(b, q.shape[1], q.shape[2])
