"""What the engine hands the model for one step: new tokens and where their KV lives.

The model reads and writes KV only through page tables. A step holds any mix of prefill
chunks (``q_len >= 1``, possibly starting or ending inside a page) and decode tokens
(``q_len == 1``). Tokens are flattened over the batch, sequence after sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SeqChunk:
    """One sequence's part of a step.

    Attributes:
        q_start: first row of this sequence in the flattened step tensors.
        q_len: new tokens of this sequence in the step (their KV is written this step).
        ctx_len: tokens with KV after this step, ``num_computed_tokens + q_len``; the new
            tokens sit at positions ``[ctx_len - q_len, ctx_len)``.
        page_table: int64 tensor ``[ceil(ctx_len / block_size)]`` on the model's device:
            page ids holding positions ``[0, ctx_len)`` in order. Not contiguous in general.
    """

    q_start: int
    q_len: int
    ctx_len: int
    page_table: torch.Tensor


@dataclass
class ForwardBatch:
    """Flattened inputs of one model step (``T`` new tokens over ``len(seqs)`` sequences).

    Attributes:
        input_ids: int64 ``[T]`` token ids.
        positions: int64 ``[T]`` absolute positions (for RoPE).
        slot_mapping: int64 ``[T]`` KV slot of each new token,
            ``page_id * block_size + position % block_size``.
        seqs: per-sequence chunks, in row order.
        logits_indices: int64 ``[S]`` rows whose next-token logits the step returns
            (the last row of each sequence that samples this step).

    The arithmetic mode (default or deterministic) is not part of the batch: the engine's
    model runner picks the forward function once (``model/llama.py``,
    ``model/deterministic.py``).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    seqs: list[SeqChunk]
    logits_indices: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
