"""A request's state inside the engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from prefixcache.cache.page_table import PageTable
from prefixcache.outputs import Logprob, RequestMetrics
from prefixcache.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"        # not admitted: holds no pages
    RUNNING = "running"        # admitted: holds a page table (may be following a leader)
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One generation request.

    ``all_token_ids`` is the prompt followed by the generated tokens; the page table
    reads it. ``output_token_ids`` holds the generated tokens alone (appended alongside,
    never rebuilt). ``num_cached_tokens``: prompt tokens read from the cache, at admission
    or by following; read from the page table until :meth:`freeze_cached` fixes it (when
    the first prefill completes, at the first preemption, or when the request finishes).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float
    prompt: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    extra_keys: tuple = ()
    pin_ttl_s: float | None = None  # pin the full prompt pages once published (seconds)
    pin: Any = None              # the cache.pins.Pin made for it, once pinned
    pin_error: str | None = None  # why it could not be pinned (the pin cap)
    session_id: str | None = None  # the agent session of its tenant (cache/sessions.py)
    diagnostics: Any = None      # engine.miss_diagnostics.DiagnosticsRequest, when asked
    diagnosis: dict | None = None  # its answer, once the prefill completed
    status: RequestStatus = RequestStatus.WAITING
    all_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    page_table: PageTable | None = None
    frozen_cached: tuple[int, int] | None = None  # (cached, in-flight hit) tokens, once fixed
    prefill_done: bool = False
    num_preemptions: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None
    text: str = ""
    logprobs: list[dict[int, Logprob]] | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    cumulative_logprob: float | None = None
    generator: Any = None        # torch.Generator for seeded sampling
    penalty_counts: Any = None   # model.sampler.PenaltyCounts, when a penalty is set
    grammar: Any = None          # model.grammar.GrammarMatcher, with structured_outputs
    stop_ids: frozenset[int] = frozenset()  # sampling_params.stop_token_ids as a set
    detokenizer: Any = None
    metrics: RequestMetrics = None  # type: ignore[assignment]
    admit_seq: int = 0           # order of (re-)admission, for preemption victims
    group: Any = None            # engine.sample_group.SampleGroup of an n > 1 request
    index: int = 0               # this request's sample index in its group

    def __post_init__(self) -> None:
        if not self.all_token_ids:
            self.all_token_ids = list(self.prompt_token_ids)
        self.stop_ids = frozenset(self.sampling_params.stop_token_ids or ())
        if self.metrics is None:
            self.metrics = RequestMetrics(arrival_time=self.arrival_time)
        if self.sampling_params.logprobs is not None:
            self.logprobs = []
            self.cumulative_logprob = 0.0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def table(self) -> PageTable:
        """The page table of a queued request (it holds one from ``Scheduler.add`` until
        it is removed). Raises RuntimeError if it holds none."""
        if self.page_table is None:
            raise RuntimeError(f"request {self.request_id} holds no page table")
        return self.page_table

    @property
    def num_cached_tokens(self) -> int:
        if self.frozen_cached is not None:
            return self.frozen_cached[0]
        return self.page_table.num_cached_tokens if self.page_table else 0

    @property
    def num_inflight_hit_tokens(self) -> int:
        if self.frozen_cached is not None:
            return self.frozen_cached[1]
        return self.page_table.num_inflight_hit_tokens if self.page_table else 0

    def freeze_cached(self) -> None:
        """Fix ``num_cached_tokens`` (idempotent): a preempted request's later page
        tables do not change what it read from the cache."""
        if self.frozen_cached is None:
            self.frozen_cached = (self.num_cached_tokens, self.num_inflight_hit_tokens)

    @property
    def num_computed_tokens(self) -> int:
        return self.page_table.num_computed_tokens if self.page_table else 0

    @property
    def num_tokens_to_compute(self) -> int:
        """Tokens whose KV is still missing; the last of them yields the next token."""
        return len(self.all_token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_tokens_to_compute > 1 or not self.prefill_done

    @property
    def finished(self) -> bool:
        return self.status == RequestStatus.FINISHED

    @property
    def read_cache(self) -> bool:
        """Requests asking for prompt logprobs compute every position."""
        return self.sampling_params.prompt_logprobs is None
