"""Token sampling kernels: greedy, temperature, top-k, top-p, min-p, penalties, logprobs.

The engine's model runner (``engine/model_runner.py``) calls them once per step.

Random rows use the exponential race (Gumbel-max in another form): the token is
``argmax(p_i / q_i)`` with ``q_i ~ Exp(1)`` drawn from the request's generator, which
samples exactly from ``p``. A request with a ``seed`` owns a ``torch.Generator`` seeded
with it and draws one noise vector per output token, so its tokens depend only on its
seed and its logits, never on the cache state or the rest of the batch.

Structured outputs: rows with a grammar get its token bitmask (``-inf`` on the tokens
the grammar does not allow) before penalties and truncation, by xgrammar's kernel over
the whole batch at once.

Logprobs are of the model's raw distribution (``log_softmax`` of the logits before
temperature, truncation and the grammar mask), as vLLM returns by default.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixcache.model.grammar import apply_bitmask
from prefixcache.sampling_params import SamplingParams


@dataclass
class TokenLogprobs:
    """Logprobs at one position: the chosen token and the top-k alternatives."""

    token_id: int
    logprob: float
    rank: int              # 1-based rank of ``token_id`` in the distribution
    top_ids: list[int]
    top_logprobs: list[float]


class PenaltyCounts:
    """One request's token statistics for penalties, kept on the logits' device and
    updated by deltas (:meth:`update` costs O(new tokens), never O(history)).

    Attributes:
        output_counts: float32 ``[V]``, how often each token was generated.
        prompt_seen: bool ``[V]``, the prompt's tokens (``None`` when the request has no
            repetition penalty: presence and frequency penalties count generated tokens only).
        num_counted: generated tokens counted so far.

    Raises:
        ValueError: a prompt token id outside ``[0, vocab_size)`` (from torch indexing).
    """

    def __init__(self, prompt_ids: list[int], vocab_size: int, device: torch.device | str,
                 with_prompt: bool):
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.prompt_seen: torch.Tensor | None = None
        if with_prompt:
            self.prompt_seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
            self.prompt_seen[torch.tensor(prompt_ids, dtype=torch.long, device=device)] = True
        self.num_counted = 0

    def update(self, output_ids: list[int]) -> None:
        """Count ``output_ids[num_counted:]``, the tokens generated since the last call."""
        new = output_ids[self.num_counted:]
        if new:
            ids = torch.tensor(new, dtype=torch.long, device=self.output_counts.device)
            self.output_counts.index_add_(0, ids, torch.ones(len(new), device=ids.device))
        self.num_counted += len(new)


def has_penalties(p: SamplingParams) -> bool:
    return (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0
            or p.repetition_penalty != 1.0)


def apply_penalties(logits: torch.Tensor, counts: PenaltyCounts | None,
                    p: SamplingParams) -> torch.Tensor:
    """Presence and frequency penalties (OpenAI) over the generated tokens, and the
    repetition penalty (CTRL, Keskar et al. 2019) over the prompt and generated tokens,
    as vLLM and transformers apply them. ``logits``: ``[V]``; returns a new tensor (or
    ``logits`` itself when no penalty is set)."""
    if counts is None or not has_penalties(p):
        return logits
    out = logits
    generated = counts.output_counts
    if p.repetition_penalty != 1.0:
        seen = generated > 0
        if counts.prompt_seen is not None:
            seen = seen | counts.prompt_seen
        rp = p.repetition_penalty
        out = torch.where(seen, torch.where(out < 0, out * rp, out / rp), out)
    if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
        out = (out - p.frequency_penalty * generated
               - p.presence_penalty * (generated > 0).to(out.dtype))
    return out


def _truncate(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Temperature, top-k, top-p and min-p on one row ``[V]`` of logits."""
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # drop tokens once the mass before them already reaches top_p (keep the first)
        drop = probs.cumsum(-1) - probs >= p.top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(0, order, sorted_logits)
    if p.min_p > 0.0:
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
    return logits


def _sample_row(row: torch.Tensor, p: SamplingParams, counts: PenaltyCounts | None,
                gen: torch.Generator | None) -> torch.Tensor:
    """The token (a 0-d tensor on the row's device) picked from one row ``[V]`` of logits
    (an exponential race for sampled rows)."""
    row = apply_penalties(row, counts, p)
    if p.temperature == 0.0:
        return torch.argmax(row)
    probs = _truncate(row, p).softmax(-1)
    q = torch.empty_like(probs).exponential_(generator=gen)
    return torch.argmax(probs / q)


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None], penalties: list[PenaltyCounts | None],
           default_generator: torch.Generator | None = None,
           grammar_mask: tuple[torch.Tensor, list[int]] | None = None,
           ) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Pick one token per row.

    Args:
        logits: float32 ``[S, V]``, one row per sampling request.
        params: ``S`` sampling parameters.
        generators: per row, the request's seeded generator or ``None``.
        penalties: per row, the request's up-to-date :class:`PenaltyCounts`, or ``None``
            (no penalty set: nothing about its history is read).
        default_generator: for unseeded random rows.
        grammar_mask: ``(bitmask, rows)``: int32 ``[S, ceil(V / 32)]`` token bitmask
            and the rows it constrains (structured outputs); those rows sample only
            allowed tokens. ``None``: no row is constrained.

    Returns:
        The ``S`` token ids, and per row the logprobs if ``params[i].logprobs`` is set.
    """
    picked = logits
    if grammar_mask is not None and grammar_mask[1]:
        picked = logits.clone()  # logprobs stay those of the raw distribution
        apply_bitmask(picked, grammar_mask[0], grammar_mask[1])
    if params and all(p.temperature == 0.0 and c is None for p, c in zip(params, penalties)):
        tokens = torch.argmax(picked, dim=-1).tolist()  # all greedy: one batched argmax
    elif params:  # one device-to-host copy for the whole step
        tokens = torch.stack([_sample_row(picked[i], p, penalties[i],
                                          generators[i] or default_generator)
                              for i, p in enumerate(params)]).tolist()
    else:
        tokens = []
    lps: list[TokenLogprobs | None] = [None] * len(params)
    want = [i for i, p in enumerate(params) if p.logprobs is not None]
    if want:
        raw = torch.log_softmax(logits[want].float(), dim=-1)
        for j, i in enumerate(want):
            lps[i] = token_logprobs(raw[j], tokens[i], params[i].logprobs or 0)
    return tokens, lps


def token_logprobs(logprobs: torch.Tensor, token_id: int, k: int) -> TokenLogprobs:
    """Logprob and rank of ``token_id`` and the top ``k`` of one row ``[V]`` of
    log-probabilities."""
    lp = logprobs[token_id]
    rank = int((logprobs > lp).sum().item()) + 1
    if k > 0:
        top = torch.topk(logprobs, k)
        top_ids, top_lps = top.indices.tolist(), top.values.tolist()
    else:
        top_ids, top_lps = [], []
    return TokenLogprobs(token_id, float(lp.item()), rank, top_ids, top_lps)
