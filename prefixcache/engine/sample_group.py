"""Parallel samples of one prompt (``n > 1`` or ``best_of``): one prefill, shared pages.

A group is one request per sample. Member 0, the *parent*, carries the caller's request
id and is queued and prefilled like any request. The other members hold no pages until
the parent's prefill step samples: the runner then samples every member's first token
from the parent's last-position logits (one prefill for all), and the engine forks each
member from the parent's page table (``KVCacheManager.fork``):

    region of the parent's table     the member's table
    full prompt pages (published)    the same pages, one more holder each (shared)
    last partial prompt page         a private copy (``KVPool.copy_pages``)
    full pages not published         private copies (caching off, a duplicate page)

From then on a member is an ordinary running request: it decodes in the same batches,
is preempted alone (and recomputes from the cache like any preempted request), and
finishes alone. A member that cannot get its pages at the fork waits in the queue and
recomputes its partial page from the cache when admitted.

Seeds: member ``i`` samples with ``seed + i`` (vLLM's rule), so a seeded request's
samples are reproducible per index and sample 0 equals the same request with ``n=1``.
Greedy samples are identical.

``best_of``: ``best_of`` members run; the ``n`` with the highest cumulative logprob are
returned, best first, indexed ``0..n-1`` (OpenAI's completions and vLLM do the same),
once every member finished.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from prefixcache.engine.request import Request
from prefixcache.sampling_params import SamplingParams


def member_id(request_id: str, index: int) -> str:
    """Engine-internal id of member ``index`` (member 0 keeps the caller's id)."""
    return request_id if index == 0 else f"{request_id}#{index}"


def member_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters member ``index`` samples with: one sample, seed ``seed + index``
    (wrapped to stay under 2**64), the sampled token's logprob always computed when
    ``best_of`` ranks the samples, prompt logprobs for member 0 only."""
    logprobs = params.logprobs
    if params.best_of is not None and logprobs is None:
        logprobs = 0
    seed = params.seed
    if seed is not None:
        seed += index
        if seed >= 1 << 64:  # past what a generator takes: wrap around 64 bits
            seed -= 1 << 64
    # only the parent computes the prompt's logprobs (a preempted sample would again)
    prompt_logprobs = params.prompt_logprobs if index == 0 else None
    return dataclasses.replace(params, n=1, best_of=None, seed=seed, logprobs=logprobs,
                               prompt_logprobs=prompt_logprobs)


@dataclass(eq=False)
class SampleGroup:
    """The members of one request with ``params.num_samples > 1``.

    Attributes:
        request_id: the caller's request id (the parent's).
        params: the caller's sampling parameters.
        members: one request per sample, by index; ``members[0]`` is the parent.
        forked: the parent's prefill sampled and the other members were forked.
    """

    request_id: str
    params: SamplingParams
    members: list[Request]
    forked: bool = False

    @property
    def parent(self) -> Request:
        return self.members[0]

    @property
    def unforked(self) -> list[Request]:
        """Members still waiting for the parent's prefill (they hold no pages)."""
        return [] if self.forked else self.members[1:]

    @property
    def finished(self) -> bool:
        return all(m.finished for m in self.members)

    @property
    def ranked(self) -> bool:
        """Whether only the best ``n`` of more samples are returned."""
        return self.params.best_of is not None and self.params.best_of > self.params.n

    def returned(self) -> list[Request]:
        """The members whose outputs the caller gets, in output index order: all of
        them, or with ``best_of`` the ``n`` of highest cumulative logprob (ties keep the
        lower index first; a member that generated nothing ranks last)."""
        if not self.ranked:
            return list(self.members)

        def score(m: Request) -> float:
            lp = m.cumulative_logprob
            return float("-inf") if lp is None or not m.output_token_ids else lp

        return sorted(self.members, key=score, reverse=True)[:self.params.n]
