"""A minimal page allocator and step builder to drive ``PagedLlama`` in tests.

Pages come from a shuffled free list, so page tables are not contiguous. This is test
scaffolding, not the engine's scheduler: no hashing, no eviction, no ref counts.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from prefixcache.model.config import ModelConfig
from prefixcache.model.deterministic import forward_deterministic
from prefixcache.model.forward_batch import ForwardBatch, SeqChunk
from prefixcache.model.llama import PagedLlama, forward_default
from prefixcache.model.loader import make_backend
from prefixcache.model.weights import load_hf_weights


def paged_copy(hf) -> PagedLlama:
    """A float32 CPU ``PagedLlama`` with the config and weights of HF model ``hf``, on the
    compute backend ``auto`` picks (the CPU kernels in tests, see ``tests/conftest.py``)."""
    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": [type(hf).__name__]})
    m = cpu_model(cfg)
    load_hf_weights(m, hf.state_dict().__getitem__)
    return m


def cpu_model(cfg: ModelConfig, device: torch.device | str = "cpu",
              dtype: torch.dtype = torch.float32, backend: str = "auto") -> PagedLlama:
    """An uninitialised ``PagedLlama`` of ``cfg`` on the compute backend ``backend``
    (:func:`prefixcache.model.loader.make_backend`), as the loader builds it."""
    return PagedLlama(cfg, device, dtype, make_backend(backend, device, dtype))


@dataclass
class Seq:
    """A sequence's tokens with KV computed (``computed``) and its pages."""

    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)

    @property
    def computed(self) -> int:
        return len(self.tokens)


class PagedRunner:
    """Owns a KV pool for ``model`` and runs steps of (sequence, new tokens) pairs.

    Args:
        num_pages, block_size: pool geometry. seed: shuffles the free list.
        deterministic: run every step in deterministic mode.
    """

    def __init__(self, model, num_pages: int = 256, block_size: int = 16, seed: int = 0,
                 deterministic: bool = False):
        self.model = model
        self.block_size = block_size
        self.kv = model.new_kv_pool(num_pages, block_size)
        self.free = list(range(num_pages))
        random.Random(seed).shuffle(self.free)
        self.deterministic = deterministic

    def fork(self, seq: Seq, num_tokens: int) -> Seq:
        """A new sequence sharing ``seq``'s first ``num_tokens`` (full pages) of KV."""
        assert num_tokens % self.block_size == 0
        return Seq(list(seq.tokens[:num_tokens]), list(seq.pages[:num_tokens // self.block_size]))

    def step(self, work: list[tuple[Seq, list[int]]], all_logits: bool = False
             ) -> list[torch.Tensor]:
        """Append new tokens to sequences in one model step.

        Returns per sequence float32 logits ``[n_new, vocab]`` when ``all_logits`` else
        ``[vocab]`` (last new token).
        """
        dev, bs = self.model.device, self.block_size
        ids, pos, slots, seqs, rows = [], [], [], [], []
        for seq, new in work:
            start = seq.computed
            ctx = start + len(new)
            while len(seq.pages) * bs < ctx:
                seq.pages.append(self.free.pop())
            q_start = len(ids)
            ids += new
            pos += range(start, ctx)
            slots += [seq.pages[p // bs] * bs + p % bs for p in range(start, ctx)]
            seqs.append(SeqChunk(q_start, len(new), ctx,
                                 torch.tensor(seq.pages[:(ctx + bs - 1) // bs], device=dev)))
            rows += range(q_start, q_start + len(new)) if all_logits else [q_start + len(new) - 1]
            seq.tokens += new
        t = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
        batch = ForwardBatch(t(ids), t(pos), t(slots), seqs, t(rows))
        forward = forward_deterministic if self.deterministic else forward_default
        logits = forward(self.model, batch, self.kv)
        out, i = [], 0
        for _, new in work:
            n = len(new) if all_logits else 1
            out.append(logits[i:i + n] if all_logits else logits[i])
            i += n
        return out

    def prefill(self, seq: Seq, tokens: list[int], chunk: int | None = None,
                all_logits: bool = False) -> torch.Tensor:
        """Prefill ``tokens`` in chunks of ``chunk`` (one step each). Returns the logits of
        the last chunk's step (all of its rows when ``all_logits``), concatenated over
        chunks when ``all_logits``."""
        chunk = chunk or len(tokens)
        outs = [self.step([(seq, tokens[i:i + chunk])], all_logits)[0]
                for i in range(0, len(tokens), chunk)]
        return torch.cat(outs) if all_logits else outs[-1]

    def greedy(self, seq: Seq, last_logits: torch.Tensor, steps: int) -> list[int]:
        """Greedy-decode ``steps`` tokens one step each, starting from ``last_logits``."""
        out = []
        for _ in range(steps):
            tok = int(last_logits.argmax())
            out.append(tok)
            last_logits = self.step([(seq, [tok])])[0]
        return out
