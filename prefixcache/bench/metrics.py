"""Per-request results and the figures derived from them.

Definitions (all times in seconds, measured where the run's client sits: in-process for
offline peers, the HTTP client for serving peers):

- **TTFT**: first token time minus send time. **TPOT**: (last token time - first token
  time) / (output tokens - 1), for requests with at least 2 output tokens.
- **hit rate**: cached prompt tokens / prompt tokens, over requests that report
  ``cached_tokens`` (``None`` when none do).
- **prefill tokens computed**: the engine's own counter when it has one (ours, vLLM),
  else prompt minus cached tokens when the peer reports cached tokens, else all prompt
  tokens for peers that keep no cache (transformers), else unknown.
- **effective prefill throughput**: all prompt tokens (cached ones included) divided by
  the time during which at least one request was waiting for its first token.
- **output tokens/s** and **requests/s**: totals divided by the run's wall time.
- **peak RSS**: the largest resident set (``VmHWM``) of the peer's processes during the
  run, summed over the process tree (server peers) or of this process (offline peers),
  read from ``/proc`` after resetting the peak through ``/proc/PID/clear_refs``.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np


@dataclass
class RequestResult:
    id: str
    session: str
    turn: int
    group: str
    tenant: str | None
    warm_expected: bool | None
    prompt_tokens: int
    cached_tokens: int | None  # None: the peer does not report it
    output_tokens: int
    send_time: float  # seconds since the run started
    first_token_time: float | None
    end_time: float | None
    reference_prompt_tokens: int | None = None
    reference_cached_tokens: int | None = None
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.send_time

    @property
    def tpot(self) -> float | None:
        if self.first_token_time is None or self.end_time is None or self.output_tokens < 2:
            return None
        return (self.end_time - self.first_token_time) / (self.output_tokens - 1)

    @property
    def e2e(self) -> float | None:
        return None if self.end_time is None else self.end_time - self.send_time

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(ttft_s=self.ttft, tpot_s=self.tpot, e2e_s=self.e2e)
        return d


def percentile(values: Iterable[float | None], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of the values that are not ``None``, with linear
    interpolation between closest ranks (``numpy.percentile``'s default); ``None`` for no
    values."""
    xs = [v for v in values if v is not None]
    return float(np.percentile(xs, q)) if xs else None


def mean(values: Iterable[float | None]) -> float | None:
    """The mean of the values that are not ``None``; ``None`` for no values."""
    xs = [v for v in values if v is not None]
    return float(np.mean(xs)) if xs else None


def hit_rate(results: Iterable[RequestResult]) -> float | None:
    rs = [r for r in results if r.cached_tokens is not None and r.error is None]
    prompt = sum(r.prompt_tokens for r in rs)
    return sum(r.cached_tokens or 0 for r in rs) / prompt if prompt else None


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the union of ``[start, end]`` intervals."""
    total, cur_s = 0.0, 0.0
    cur_e: float | None = None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def effective_prefill_throughput(results: list[RequestResult]) -> float | None:
    ok = [r for r in results if r.first_token_time is not None and r.error is None]
    busy = union_length((r.send_time, r.first_token_time) for r in ok
                        if r.first_token_time is not None)
    return sum(r.prompt_tokens for r in ok) / busy if busy > 0 else None


# --------------------------------------------------------------------------- tenants
def cross_tenant_hits(results: list[RequestResult], token_ids: dict[str, list[int]],
                      block_size: int = 16) -> tuple[int, int]:
    """Cached tokens a request cannot have got from its own tenant.

    For request ``r`` of tenant ``t``, the most it may legitimately find cached is
    ``B(r)`` = the longest common token prefix between ``r``'s prompt and the prompt of
    any *other* request of tenant ``t`` that was sent before ``r`` produced its first token
    (earlier, or concurrent with it: the server may have admitted that one first),
    rounded up to a whole page of ``block_size`` tokens. So a tenant's first-ever request
    has ``B(r) = 0``, and a tenant's first request for a prefix none of its own requests
    carries has ``B(r)`` of at most the page holding their common opening (the chat
    template's first tokens). ``r`` counts as a cross-tenant hit when
    ``cached_tokens > B(r)``; the excess is cross-tenant tokens. (Outputs of earlier
    requests are ignored: no workload's prompt continues a tenant-mate's output.) Returns
    ``(hits, excess tokens)``; requests that report no cached tokens are skipped.
    """
    hits = tokens = 0
    for r in results:
        if r.cached_tokens is None or r.error is not None:
            continue
        seen_by = r.first_token_time if r.first_token_time is not None else r.end_time
        ids = token_ids[r.id]
        best = max((len(os.path.commonprefix([ids, token_ids[e.id]])) for e in results
                    if e is not r and e.tenant == r.tenant
                    and (seen_by is None or e.send_time < seen_by)),
                   default=0)
        bound = -(-best // block_size) * block_size
        if r.cached_tokens > bound:
            hits += 1
            tokens += r.cached_tokens - bound
    return hits, tokens


# --------------------------------------------------------------------------- memory
def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants, from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _status_kib(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def reset_peak_rss(pids: Iterable[int]) -> None:
    for p in pids:
        try:
            Path(f"/proc/{p}/clear_refs").write_text("5")
        except OSError:
            pass


def peak_rss_bytes(pids: Iterable[int]) -> int:
    return sum(_status_kib(p, "VmHWM") for p in pids) * 1024


def rss_bytes(pids: Iterable[int]) -> int:
    return sum(_status_kib(p, "VmRSS") for p in pids) * 1024


class PeakRSS:
    """Peak RSS of a process tree over a span: the reset peak (``VmHWM``) of each process,
    plus periodic samples via :meth:`sample` that catch processes that come and go."""

    def __init__(self, pid: int | None = None):
        self.pid = pid or os.getpid()
        self.peak = 0

    def start(self) -> None:
        reset_peak_rss(process_tree(self.pid))
        self.peak = rss_bytes(process_tree(self.pid))

    def sample(self) -> None:
        self.peak = max(self.peak, rss_bytes(process_tree(self.pid)))

    def stop(self) -> int:
        self.peak = max(self.peak, peak_rss_bytes(process_tree(self.pid)))
        return self.peak


def first_errors(results: Iterable[RequestResult], n: int = 3, chars: int = 300) -> list[str]:
    """The first ``n`` distinct error messages of a run, in result order, each cut to
    ``chars`` characters and prefixed with the request id (``"id: message"``)."""
    out: list[str] = []
    seen: set[str] = set()
    for r in results:
        if r.error is None or r.error in seen:
            continue
        seen.add(r.error)
        out.append(f"{r.id}: {r.error}"[:chars])
        if len(out) == n:
            break
    return out


# --------------------------------------------------------------------------- summary
@dataclass
class RunInfo:
    """What was run: recorded verbatim in the JSON."""

    workload: str
    model: str
    peer: str
    mode: str  # "offline" | "serving"
    dtype: str
    threads: int
    concurrency: int
    machine: str
    block_size: int = 16
    max_model_len: int | None = None
    peer_detail: dict = field(default_factory=dict)


def summarize(info: RunInfo, results: list[RequestResult], *, wall_s: float,
              peak_rss: int | None, prefill_tokens_computed: int | None = None,
              token_ids: dict[str, list[int]] | None = None,
              reference_hit_rate: float | None = None, cache_stats: dict | None = None,
              cached_tokens_total: int | None = None) -> dict:
    """One JSON-ready object per run (the keys are documented in
    :mod:`prefixcache.bench.report`).

    ``cached_tokens_total``: for a peer that reports no per-request cached tokens but
    whose total prefix reuse is known (llama.cpp's log); it sets ``cached_tokens`` and
    ``hit_rate`` for the run, with ``cached_tokens_source = "server log"``."""
    ok = [r for r in results if r.error is None]
    prompt = sum(r.prompt_tokens for r in ok)
    reports_cached = any(r.cached_tokens is not None for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok) if reports_cached else None
    out_tok = sum(r.output_tokens for r in ok)
    if prefill_tokens_computed is None and cached is not None:  # i.e. reports_cached
        prefill_tokens_computed = prompt - cached
    cold = [r for r in ok if r.warm_expected is False]
    warm = [r for r in ok if r.warm_expected]
    run_hit_rate = hit_rate(ok)
    source = "per request" if reports_cached else None
    if not reports_cached and cached_tokens_total is not None:
        cached, source = cached_tokens_total, "server log"
        run_hit_rate = cached / prompt if prompt else None
    d = asdict(info)
    d.update(
        requests=len(results), errors=len(results) - len(ok), prompt_tokens=prompt,
        cached_tokens=cached, cached_tokens_source=source, hit_rate=run_hit_rate,
        prefill_tokens_computed=prefill_tokens_computed,
        prefill_computed_fraction=(prefill_tokens_computed / prompt
                                   if prefill_tokens_computed is not None and prompt else None),
        output_tokens=out_tok,
        ttft_p50_s=percentile((r.ttft for r in ok), 50),
        ttft_p90_s=percentile((r.ttft for r in ok), 90),
        ttft_p99_s=percentile((r.ttft for r in ok), 99), ttft_mean_s=mean(r.ttft for r in ok),
        ttft_cold_p50_s=percentile((r.ttft for r in cold), 50),
        ttft_warm_p50_s=percentile((r.ttft for r in warm), 50),
        cold_requests=len(cold), warm_requests=len(warm), warm_hit_rate=hit_rate(warm),
        tpot_p50_s=percentile((r.tpot for r in ok), 50), tpot_mean_s=mean(r.tpot for r in ok),
        e2e_p50_s=percentile((r.e2e for r in ok), 50),
        effective_prefill_tok_s=effective_prefill_throughput(ok),
        output_tok_s=out_tok / wall_s if wall_s > 0 else None,
        requests_per_s=len(ok) / wall_s if wall_s > 0 else None,
        wall_s=wall_s, peak_rss_mib=peak_rss / 2**20 if peak_rss else None,
    )
    d["first_errors"] = first_errors(results)
    if d["ttft_cold_p50_s"] and d["ttft_warm_p50_s"]:
        d["ttft_cold_over_warm"] = d["ttft_cold_p50_s"] / d["ttft_warm_p50_s"]
    if info.workload == "multi-tenant" or len({r.tenant for r in ok}) > 1:
        if token_ids is not None and reports_cached:
            d["cross_tenant_hits"], d["cross_tenant_tokens"] = cross_tenant_hits(
                ok, token_ids, info.block_size)
        else:
            d["cross_tenant_hits"] = d["cross_tenant_tokens"] = None
    if reference_hit_rate is not None:
        with_ref = [r for r in ok if r.reference_prompt_tokens]
        d["reference_hit_rate"] = reference_hit_rate
        d["reference_calls"] = len(with_ref)
        d["hit_rate_on_reference_calls"] = hit_rate(with_ref)
        d["reference"] = ("DeepSeek production usage.prompt_tokens_details.cached_tokens "
                          "over the same calls")
    if cache_stats:
        d["cache_stats"] = cache_stats
    d["per_request"] = [r.to_dict() for r in results]
    return d
