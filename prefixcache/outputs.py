"""Request outputs, shaped like vLLM's ``RequestOutput`` / ``CompletionOutput``."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    """Log-probability of one token (natural log), its 1-based rank, and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# One entry per generated token: {token_id: Logprob}, holding the sampled token and the
# top-k alternatives, as vLLM returns them.
SampleLogprobs = list[dict[int, Logprob]]


class CompletionOutput:
    """One completion of a request: cumulative ``text``, ``token_ids`` and ``logprobs``.

    ``token_ids`` and ``logprobs`` may be given as the request's own growing lists with
    ``num_tokens``: the output then shows their first ``num_tokens`` entries, and building
    it costs O(1) instead of a copy per step. The prefix is copied only when read (and not
    at all for a finished output, whose lists no longer grow); :meth:`token_ids_from` and
    :meth:`logprobs_from` copy only a tail.
    """

    def __init__(self, index: int, text: str, token_ids: list[int],
                 cumulative_logprob: float | None = None,
                 logprobs: SampleLogprobs | None = None,
                 finish_reason: str | None = None,  # "stop" | "length" | "abort" | "error"
                 stop_reason: int | str | None = None, *, num_tokens: int | None = None):
        self.index = index
        self.text = text
        self.cumulative_logprob = cumulative_logprob
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason
        self._ids_src = token_ids
        self._lps_src = logprobs
        self._n = len(token_ids) if num_tokens is None else num_tokens
        self._ids: list[int] | None = token_ids if num_tokens is None else None
        self._lps: SampleLogprobs | None = logprobs if num_tokens is None else None

    @property
    def num_tokens(self) -> int:
        """``len(token_ids)`` without copying."""
        return self._n

    def _prefix(self, src: list) -> list:
        if self.finish_reason is not None and len(src) == self._n:
            return src  # final: the request's lists stop growing
        return src[:self._n]

    @property
    def token_ids(self) -> list[int]:
        if self._ids is None:
            self._ids = self._prefix(self._ids_src)
        return self._ids

    @token_ids.setter
    def token_ids(self, value: list[int]) -> None:
        self._ids = self._ids_src = value
        self._n = len(value)

    @property
    def logprobs(self) -> SampleLogprobs | None:
        if self._lps is None and self._lps_src is not None:
            self._lps = self._prefix(self._lps_src)
        return self._lps

    @logprobs.setter
    def logprobs(self, value: SampleLogprobs | None) -> None:
        self._lps = self._lps_src = value

    def token_ids_from(self, start: int) -> list[int]:
        """``token_ids[start:]``, copying only that tail."""
        return self._ids_src[start:self._n]

    def logprobs_from(self, start: int) -> SampleLogprobs | None:
        """``logprobs[start:]``, copying only that tail (``None`` without logprobs)."""
        return None if self._lps_src is None else self._lps_src[start:self._n]

    def _fields(self) -> tuple:
        return (self.index, self.text, self.token_ids, self.cumulative_logprob, self.logprobs,
                self.finish_reason, self.stop_reason)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompletionOutput):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, like the dataclass it replaces

    def __repr__(self) -> str:
        return (f"CompletionOutput(index={self.index}, text={self.text!r}, "
                f"token_ids={self.token_ids!r}, finish_reason={self.finish_reason!r}, "
                f"stop_reason={self.stop_reason!r})")


@dataclass
class RequestMetrics:
    """Timestamps in seconds (``time.perf_counter`` clock) and derived latencies."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token, seconds."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class RequestOutput:
    """What one request produced so far (streaming) or in total (``finished``).

    ``num_cached_tokens`` is the number of prompt tokens whose prefill was skipped (read
    from published pages, at admission or by following an in-flight leader); it is final
    before the first output token and never changes after. ``outputs`` holds one
    completion per returned sample (``SamplingParams.n``), in ``index`` order; they share
    the prompt, so it and its cached tokens count once.
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def ttft(self) -> float | None:
        return self.metrics.ttft if self.metrics else None
