"""Token sampling: greedy, temperature, top-k, top-p, min-p, penalties, logprobs.

Random rows use the exponential race (Gumbel-max in another form): the token is
``argmax(p_i / q_i)`` with ``q_i ~ Exp(1)`` drawn from the request's generator, which
samples exactly from ``p``. A request with a ``seed`` owns a ``torch.Generator`` seeded
with it and draws one noise vector per output token, so its tokens depend only on its
seed and its logits, never on the cache state or the rest of the batch.

Logprobs are of the model's raw distribution (``log_softmax`` of the logits before
temperature and truncation), as vLLM returns by default.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixcache.sampling_params import SamplingParams


@dataclass
class TokenLogprobs:
    """Logprobs at one position: the chosen token and the top-k alternatives."""

    token_id: int
    logprob: float
    rank: int              # 1-based rank of ``token_id`` in the distribution
    top_ids: list[int]
    top_logprobs: list[float]


def apply_penalties(logits: torch.Tensor, output_ids: list[int], p: SamplingParams) -> torch.Tensor:
    """Presence, frequency (OpenAI) and repetition (CTRL, Keskar et al. 2019) penalties
    over the tokens generated so far. ``logits``: ``[V]``; returns a new tensor."""
    if not output_ids or (p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
                          and p.repetition_penalty == 1.0):
        return logits
    ids = torch.tensor(output_ids, device=logits.device, dtype=torch.long)
    counts = torch.zeros_like(logits).scatter_add_(0, ids, torch.ones_like(ids, dtype=logits.dtype))
    seen = counts > 0
    out = logits.clone()
    if p.repetition_penalty != 1.0:
        pos = out > 0
        out = torch.where(seen & pos, out / p.repetition_penalty, out)
        out = torch.where(seen & ~pos, out * p.repetition_penalty, out)
    out = out - p.frequency_penalty * counts - p.presence_penalty * seen.to(out.dtype)
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


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator | None], output_ids: list[list[int]],
           default_generator: torch.Generator | None = None,
           ) -> tuple[list[int], list[TokenLogprobs | None]]:
    """Pick one token per row.

    Args:
        logits: float32 ``[S, V]``, one row per sampling request.
        params: ``S`` sampling parameters.
        generators: per row, the request's seeded generator or ``None``.
        output_ids: per row, tokens generated so far (penalties).
        default_generator: for unseeded random rows.

    Returns:
        The ``S`` token ids, and per row the logprobs if ``params[i].logprobs`` is set.
    """
    rows = []
    for i, p in enumerate(params):
        row = apply_penalties(logits[i], output_ids[i], p)
        if p.temperature == 0.0:
            rows.append(torch.argmax(row))
            continue
        row = _truncate(row, p)
        probs = row.softmax(-1)
        gen = generators[i] or default_generator
        q = torch.empty_like(probs).exponential_(generator=gen)
        rows.append(torch.argmax(probs / q))
    tokens = torch.stack(rows).tolist() if rows else []
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
