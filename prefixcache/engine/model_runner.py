"""The model runner: one scheduled step in, sampled tokens out, device work finished.

``ModelRunner.run`` builds the step's flattened :class:`ForwardBatch` from the
scheduler's plan, runs the forward function chosen once at construction (default or
deterministic arithmetic), samples one token per sampling request, computes prompt
logprobs, and then synchronises the device. DESIGN's publication rule depends on that
last part: the engine commits (publishes) pages only after ``run`` returns, so every
kernel that writes their KV must have finished, even in a step that samples nothing
(all sequences mid-prefill), where no ``tolist()`` would wait for the device.
The runner also owns the :class:`KVPool`.

Nothing here is global: the batch and the pool are passed explicitly to the model.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from prefixcache.config import EngineConfig
from prefixcache.engine.request import Request
from prefixcache.engine.scheduler import ScheduledSeq
from prefixcache.model.config import ModelConfig
from prefixcache.model.deterministic import forward_deterministic
from prefixcache.model.forward_batch import ForwardBatch, SeqChunk
from prefixcache.model.grammar import allocate_bitmask
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.sampler import (
    PenaltyCounts,
    TokenLogprobs,
    has_penalties,
    sample,
    token_logprobs,
)

Forward = Callable[[ForwardBatch, KVPool], torch.Tensor]


def device_sync(device: torch.device) -> Callable[[], None]:
    """A function that waits until the work queued on ``device``'s current stream is done
    (a no-op on CPU, where every kernel has finished when it returns)."""
    if device.type == "cuda":
        return lambda: torch.cuda.current_stream(device).synchronize()
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def num_kv_pages(config: EngineConfig, mc: ModelConfig) -> int:
    """Pages of the KV pool: ``config.num_pages``, or as many as ``kv_cache_bytes`` hold
    in the pool's dtype (``config.kv_torch_dtype``: bfloat16 holds twice float32's pages,
    int8 ``2 * head_dim / (head_dim + 4)`` times)."""
    per_token = KVPool.bytes_per_token(mc.num_hidden_layers, mc.num_key_value_heads,
                                       mc.head_dim, config.kv_torch_dtype)
    return config.num_pages or max(2, config.kv_cache_bytes // (per_token * config.block_size))


@dataclass
class BatchLayout:
    """Where each request's rows sit in the step's logits.

    Attributes:
        sample_rows: request id -> logits row of its next-token distribution.
        prompt_rows: request id -> ``(first logits row, first position, end position)``
            of the positions ``[first, end)`` whose next token is a prompt token.
    """

    sample_rows: dict[str, int] = field(default_factory=dict)
    prompt_rows: dict[str, tuple[int, int, int]] = field(default_factory=dict)


@dataclass
class StepResult:
    """What a step produced, before anything is published.

    Attributes:
        sampled: per sampling sequence (in plan order): the sequence, its token, and its
            logprobs if requested.
        prompt_logprobs: per prompt-logprobs request: the request, the first position,
            and one entry per position (scoring the prompt token after it).
    """

    sampled: list[tuple[ScheduledSeq, int, TokenLogprobs | None]]
    prompt_logprobs: list[tuple[Request, int, list[TokenLogprobs]]]


class ModelRunner:
    """Runs model steps over a KV pool it owns.

    Args:
        model: anything with ``forward(batch, kv) -> logits`` (a ``PagedLlama``, or a test
            double); with ``config.deterministic`` it must be a ``PagedLlama``.
        model_config: the model's hyper-parameters (KV geometry, vocabulary).
        config: engine configuration (block size, pool size, dtype, device, seed, mode).

    Attributes:
        kv: the KV pool, ``num_pages`` pages of ``config.block_size`` tokens.
        forward: the forward function, chosen once.
        sync: called at the end of every step; waits for the device (replaceable in tests).
        generator: the default generator of unseeded random sampling.
    """

    def __init__(self, model: Any, model_config: ModelConfig, config: EngineConfig):
        self.model = model
        self.block_size = config.block_size
        self.vocab_size = model_config.vocab_size
        self.device = torch.device(config.device)
        self.num_pages = num_kv_pages(config, model_config)
        mc = model_config
        self.kv = KVPool(mc.num_hidden_layers, self.num_pages, self.block_size,
                         mc.num_key_value_heads, mc.head_dim, config.kv_torch_dtype, self.device,
                         zeros=getattr(getattr(model, "backend", None), "zeros", None))
        # Chosen once; the default one looks ``model.forward`` up per call, so a test can
        # wrap it (to inject a failure) after the engine is built.
        self.forward: Forward = (partial(forward_deterministic, model) if config.deterministic
                                 else lambda batch, kv: model.forward(batch, kv))
        self.sync: Callable[[], None] = device_sync(self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(config.seed)
        self._bitmask: torch.Tensor | None = None  # structured outputs' token bitmask, reused

    def run(self, scheduled: list[ScheduledSeq]) -> StepResult:
        """Run one step; returns only after the device finished it.

        Raises:
            Exception: whatever the model or sampling raised (nothing is synchronised
            then; the engine fails the step and publishes nothing).
        """
        batch, layout = self.build_batch(scheduled)
        with torch.inference_mode():
            logits = self.forward(batch, self.kv)
            sampled = self._sample(scheduled, logits, layout)
            prompt = self._prompt_logprobs(scheduled, logits, layout)
        self.sync()
        return StepResult(sampled, prompt)

    def warmup(self, num_tokens: int, pages: list[int]) -> None:
        """Run one prefill chunk of ``num_tokens`` tokens (token id 0) and then one decode
        row after it, writing their KV into ``pages`` (``ceil((num_tokens + 1) /
        block_size)`` free page ids, in order), outputs discarded. The memory and kernels
        of a full step are set up by it in the calling thread, so the first request does
        not pay for them.

        Raises:
            ValueError: ``num_tokens < 1`` or too few ``pages``.
        """
        bs, dev = self.block_size, self.device
        need = -(-(num_tokens + 1) // bs)
        if num_tokens < 1 or len(pages) < need:
            raise ValueError(f"warmup needs num_tokens >= 1 and {need} pages, got "
                             f"num_tokens={num_tokens} and {len(pages)} pages")
        table = torch.tensor(pages[:need], dtype=torch.long, device=dev)

        def batch(start: int, n: int) -> ForwardBatch:
            pos = torch.arange(start, start + n, device=dev)
            return ForwardBatch(
                input_ids=torch.zeros(n, dtype=torch.long, device=dev), positions=pos,
                slot_mapping=table[pos // bs] * bs + pos % bs,
                seqs=[SeqChunk(0, n, start + n, table[:-(-(start + n) // bs)])],
                logits_indices=torch.tensor([n - 1], dtype=torch.long, device=dev))

        with torch.inference_mode():
            for b in (batch(0, num_tokens), batch(num_tokens, 1)):
                self.forward(b, self.kv)
        self.sync()

    def build_batch(self, scheduled: list[ScheduledSeq]) -> tuple[ForwardBatch, BatchLayout]:
        """Flatten the step: new tokens of every sequence, their positions and KV slots,
        each sequence's page table, and the logits rows to compute (prompt-logprobs rows
        first, then the sampling row, per sequence)."""
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seqs: list[SeqChunk] = []
        logits_rows: list[int] = []
        layout = BatchLayout()
        for s in scheduled:
            req, n, pt = s.request, s.num_tokens, s.request.table
            pages, start = pt.pages, pt.num_computed_tokens
            end = start + n
            q_start = len(ids)
            ids.extend(req.all_token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(pages[p // bs] * bs + p % bs for p in range(start, end))
            seqs.append(SeqChunk(q_start, n, end, torch.tensor(
                pages[:-(-end // bs)], dtype=torch.long, device=self.device)))
            wants_prompt = req.sampling_params.prompt_logprobs is not None
            if wants_prompt and start < req.num_prompt_tokens - 1:
                last = min(end, req.num_prompt_tokens - 1)
                layout.prompt_rows[req.request_id] = (len(logits_rows), start, last)
                logits_rows.extend(range(q_start, q_start + last - start))
            if s.samples:
                layout.sample_rows[req.request_id] = len(logits_rows)
                logits_rows.append(q_start + n - 1)
        dev = self.device
        batch = ForwardBatch(
            input_ids=torch.tensor(ids, dtype=torch.long, device=dev),
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            seqs=seqs,
            logits_indices=torch.tensor(logits_rows, dtype=torch.long, device=dev))
        return batch, layout

    def _sample(self, scheduled: list[ScheduledSeq], logits: torch.Tensor, layout: BatchLayout
                ) -> list[tuple[ScheduledSeq, int, TokenLogprobs | None]]:
        samplers: list[ScheduledSeq] = []
        rows: list[int] = []
        for s in scheduled:
            if not s.samples:
                continue
            row = layout.sample_rows[s.request.request_id]
            samplers.append(s)
            rows.append(row)
            group = s.request.group
            if group is not None and s.request is group.parent:
                # the parent's prefill ends: every member samples its first token from
                # the same row (engine/sample_group.py)
                for member in group.unforked:
                    samplers.append(ScheduledSeq(member, 0, True))
                    rows.append(row)
        if not samplers:
            return []
        reqs = [s.request for s in samplers]
        # the usual step's logits hold only sampled rows, in order: no [S, V] copy then
        picked = logits if rows == list(range(logits.shape[0])) else logits[rows]
        tokens, lps = sample(picked, [r.sampling_params for r in reqs],
                             [r.generator for r in reqs], [self._penalties(r) for r in reqs],
                             self.generator, self._grammar_mask(reqs))
        return list(zip(samplers, tokens, lps))

    def _grammar_mask(self, reqs: list[Request]) -> tuple[torch.Tensor, list[int]] | None:
        """The step's token bitmask (CPU, one row per sampling request) and the rows with
        a grammar, or ``None`` when no request has one. Each matcher is first brought up
        to date with its request's output tokens (a no-op unless a token was appended
        outside ``OutputProcessor``)."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None
        if self._bitmask is None or self._bitmask.shape[0] < len(reqs):
            self._bitmask = allocate_bitmask(max(len(reqs), 8), self.vocab_size)
        bitmask = self._bitmask[:len(reqs)]
        for i in rows:
            reqs[i].grammar.advance(reqs[i].output_token_ids)
            reqs[i].grammar.fill_bitmask(bitmask, i)
        return bitmask, rows

    def _penalties(self, req: Request) -> PenaltyCounts | None:
        """The request's penalty counts, brought up to date by the tokens generated since
        its last step (``None`` without penalties: its history is not read at all)."""
        p = req.sampling_params
        if not has_penalties(p):
            return None
        if req.penalty_counts is None:
            req.penalty_counts = PenaltyCounts(req.prompt_token_ids, self.vocab_size,
                                               self.device, p.repetition_penalty != 1.0)
        req.penalty_counts.update(req.output_token_ids)
        return req.penalty_counts

    def _prompt_logprobs(self, scheduled: list[ScheduledSeq], logits: torch.Tensor,
                         layout: BatchLayout) -> list[tuple[Request, int, list[TokenLogprobs]]]:
        out = []
        for s in scheduled:
            req = s.request
            where = layout.prompt_rows.get(req.request_id)
            if where is None:
                continue
            row0, start, end = where
            lps = torch.log_softmax(logits[row0:row0 + end - start].float(), dim=-1)
            k = req.sampling_params.prompt_logprobs or 0
            out.append((req, start, [token_logprobs(lps[j], req.all_token_ids[pos + 1], k)
                                     for j, pos in enumerate(range(start, end))]))
        return out
