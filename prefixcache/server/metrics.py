"""Prometheus metrics of the server (``GET /metrics``), on a registry per app.

Request-level metrics are observed on the engine thread as outputs are produced
(:meth:`ServerMetrics.observe_output`); engine-level counters and gauges are read from
``LLMEngine.stats()`` at scrape time (:class:`EngineStatsCollector`).

Labels are bounded: no per-request label ever. When an API-key file is configured,
per-request counters carry a ``tenant`` label whose values are the tenants of that file
(initialised to 0 at start-up); without one there is no tenant label. Other labels:
``finished_reason`` (stop, length, abort, error) and ``code`` (HTTP status of rejected
requests).

``prefix_cache_queries_total`` / ``prefix_cache_hits_total`` are counted when a
request's first token is produced, the moment its ``cached_tokens`` becomes final (the
same event at which the engine counts them), so their increase over any period equals
the sum of ``prompt_tokens`` / ``cached_tokens`` of the requests that got their first
token in it.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from prefixcache.outputs import RequestOutput
from prefixcache.server.async_engine import StreamState

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
               40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
FINISH_REASONS = ("stop", "length", "abort", "error")

# (metric name without _total, help, key of LLMEngine.stats())
ENGINE_COUNTERS = (
    ("cache_diagnostics_requests", "Requests diagnosed (they asked for cache "
     "diagnostics); 0 means no per-request diagnostic work was done.", "diag_requests"),
    ("cache_diagnostics_drops_recorded", "Dropped cache pages recorded for diagnoses "
     "(one dict insert each), pages.", "diag_drops_recorded"),
    ("prefill_tokens_computed", "Prompt tokens whose KV the engine computed (prefill "
     "not skipped by the prefix cache), tokens.", "prefill_tokens_computed"),
    ("decode_tokens_computed", "Tokens computed in decode steps, tokens.",
     "decode_tokens_computed"),
    ("prefix_cache_inflight_hits", "Part of prefix_cache_hits read from pages that were "
     "still being computed by another request when this one was admitted, tokens.",
     "inflight_hits"),
    ("prefix_cache_evictions", "Cached pages evicted to make room, pages.", "evictions"),
    ("prefix_cache_published_pages", "Pages published into the prefix index, pages.",
     "published_pages"),
    ("prefix_cache_reset_dropped_pages", "Cached pages dropped by /reset_prefix_cache, "
     "pages.", "reset_dropped_pages"),
    ("kv_fork_shared_pages", "Prompt pages the parallel samples of a request (n > 1, "
     "best_of) share instead of computing or copying them, pages.", "fork_shared_pages"),
    ("kv_fork_copied_pages", "Pages copied for parallel samples (the prompt's partial last "
     "page, or a full page that is not published), pages.", "fork_copied_pages"),
    ("kv_pins_made", "Pins made (created, not refreshed).", "pins_created"),
    ("kv_pins_refused", "Pins refused by the pin cap.", "pins_refused"),
    ("kv_pins_expired", "Pins whose TTL ran out.", "pins_expired"),
    ("kv_pins_evicted", "Pins that lapsed because a page of theirs was evicted (from the "
     "pool without KV tiers, or from every tier).", "pins_evicted"),
    ("kv_pin_pages_demoted", "Pinned pages evicted from the pool into the KV tiers (their "
     "pins stay).", "pin_pages_demoted"),
    ("kv_pin_pages_reloaded", "Demoted pinned pages loaded back and pinned in the pool "
     "again.", "pin_pages_reloaded"),
    ("kv_session_calls", "Requests that named an agent session.", "session_calls"),
    ("kv_session_hits", "Session calls that read the session's kept transcript.",
     "session_hits"),
    ("kv_session_hit_tokens", "Prompt tokens such calls read from the cache, tokens.",
     "session_hit_tokens"),
    ("kv_session_pages_evicted", "Forced evictions: pages of a live session's kept "
     "transcript evicted from the pool under pressure, pages.", "session_pages_evicted"),
    ("kv_session_keeps_refused", "Session transcripts not kept: the pin cap was full of "
     "other tenants' pins.", "session_keeps_refused"),
    ("kv_sessions_closed", "Sessions closed explicitly.", "sessions_closed"),
    ("engine_steps", "Model steps run.", "steps"),
    ("engine_failed_steps", "Model steps that failed (their requests finished with an "
     "error).", "failed_steps"),
    ("engine_preemptions", "Requests preempted (recomputed later) for lack of pages.",
     "num_preemptions"),
)
# KV tiers (present only when the engine has them): per tier, counters then gauges
TIER_COUNTERS = (
    ("hit_tokens", "Prompt tokens loaded from the {tier} KV tier (part of prefix_cache_hits)"
     ", tokens."),
    ("stores", "Page groups stored into the {tier} KV tier."),
    ("store_bytes", "Bytes stored into the {tier} KV tier."),
    ("loads", "Page groups read from the {tier} KV tier."),
    ("load_bytes", "Bytes read from the {tier} KV tier."),
    ("evictions", "Pages evicted from the {tier} KV tier for its budget."),
    ("failures", "Failed stores and reads of the {tier} KV tier."),
    ("corrupt", "Entries of the {tier} KV tier that failed verification (removed; the "
     "request recomputed)."),
    ("pinned_evictions", "Pinned entries evicted from the {tier} KV tier (after every "
     "unpinned one)."),
)
TIER_GAUGES = (
    ("pages", "Pages held by the {tier} KV tier."),
    ("bytes_used", "Bytes used by the {tier} KV tier."),
    ("pinned_entries", "Entries (pages; files on disk) of the {tier} KV tier held for "
     "pins, under its pin cap."),
    ("pinned_bytes", "Bytes of the {tier} KV tier held for pins (at most "
     "max_pinned_fraction of its budget)."),
)
TIER_STORE_COUNTERS = (
    ("kv_tier_store_dropped", "KV tier stores dropped because the store queue was full.",
     "tier_store_dropped"),
    ("kv_tier_hits_skipped_slower", "KV tier hits not loaded because recompute was "
     "estimated faster.", "tier_hits_skipped_slower"),
)
# the shared tier (L4, Redis): what only a remote store has
REDIS_COUNTERS = (
    ("errors", "Calls to the shared KV tier that failed or ran past their time budget."),
    ("store_seconds", "Wall time of stores into the shared KV tier, seconds."),
    ("load_seconds", "Wall time of lookups and reads of the shared KV tier, seconds."),
    ("published_pages", "Pages queued for the shared KV tier at publication."),
    ("lock_waits", "Requests that waited for another replica computing their prefix."),
    ("lock_wait_hits", "Such waits that ended with the other replica's pages in the store."),
    ("lock_timeouts", "Such waits that ended without them (the request computed itself)."),
)
# why a page published for the shared tier was not stored (label ``reason``)
REDIS_DROP_REASONS = ("queue_full", "refused", "unavailable", "error")

ENGINE_GAUGES = (
    ("kv_pages_total", "KV pool size, pages.", "pages_total"),
    ("kv_pages_free", "Free pages (hold nothing).", "pages_free"),
    ("kv_pages_cached", "Cached-free pages: published, unreferenced, evictable.",
     "pages_cached"),
    ("kv_pages_live", "Pages held by running requests.", "pages_live"),
    ("kv_sessions_live", "Agent sessions with a running call or a kept transcript.",
     "sessions_live"),
    ("kv_session_pages_held", "Pool pages held for live sessions' transcripts, pages.",
     "session_pages_held"),
    ("requests_running", "Requests admitted and running in the engine.", "requests_running"),
    ("kv_pages_global_layers_only", "Pages of running requests that no sliding-window layer "
     "reads any more, kept for the global layers (models that interleave both), pages.",
     "pages_kept_for_global_layers"),
    ("requests_waiting", "Requests waiting for admission.", "requests_waiting"),
    ("kv_pins", "Live TTL pins (cache_ttl / pin_prefix).", "pins"),
    ("kv_pages_pinned", "Pages held by pins (evicted last).", "pages_pinned"),
    ("kv_pin_cap_pages", "Most pages pins may hold (--max-pinned-fraction).", "pin_cap_pages"),
    ("kv_pages_pinned_demoted", "Pinned pages now demoted below the pool (host RAM, disk).",
     "pin_pages_in_tiers"),
)


class EngineStatsCollector:
    """Engine counters and gauges from the latest ``LLMEngine.stats()`` snapshot."""

    def __init__(self, tenants: list[str] | None = None) -> None:
        self.snapshot: dict[str, Any] = {}
        self.tenants = tenants

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        s = self.snapshot
        for name, doc, key in ENGINE_COUNTERS:
            if key in s:
                yield CounterMetricFamily(name, doc, value=float(s[key]))
        for name, doc, key in ENGINE_GAUGES:
            if key in s:
                yield GaugeMetricFamily(name, doc, value=float(s[key]))
        reasons = {k[len("miss_reason_"):]: v for k, v in s.items()
                   if k.startswith("miss_reason_")}
        if reasons:
            fam = CounterMetricFamily(
                "cache_miss_reason", "Requests that asked for cache diagnostics, by the "
                "reason reported (none: nothing the cache held was missed).",
                labels=["reason"])
            for r, n in reasons.items():
                fam.add_metric([r], float(n))
            yield fam
        by_tenant = s.get("tenant_pages")
        if self.tenants is not None and isinstance(by_tenant, dict):
            yield from self._tenant_gauges(by_tenant)
        for tier in ("host", "disk", "redis"):
            for key, doc in TIER_COUNTERS:
                if f"{tier}_tier_{key}" in s:
                    yield CounterMetricFamily(f"{tier}_tier_{key}", doc.format(tier=tier),
                                              value=float(s[f"{tier}_tier_{key}"]))
            for key, doc in TIER_GAUGES:
                if f"{tier}_tier_{key}" in s and f"{tier}_tier_stores" in s:
                    yield GaugeMetricFamily(f"{tier}_tier_{key}", doc.format(tier=tier),
                                            value=float(s[f"{tier}_tier_{key}"]))
        for name, doc, key in TIER_STORE_COUNTERS:
            if key in s:
                yield CounterMetricFamily(name, doc, value=float(s[key]))
        for key, doc in REDIS_COUNTERS:
            if f"redis_tier_{key}" in s:
                yield CounterMetricFamily(f"redis_tier_{key}", doc,
                                          value=float(s[f"redis_tier_{key}"]))
        dropped = {r: s[f"redis_tier_store_dropped_{r}"] for r in REDIS_DROP_REASONS
                   if f"redis_tier_store_dropped_{r}" in s}
        if dropped:
            fam = CounterMetricFamily(
                "redis_tier_store_dropped", "Pages published for the shared KV tier and not "
                "stored, by reason: queue_full (its store queue was full), refused (Redis "
                "answered the write with an error: out of memory, read-only), unavailable "
                "(Redis did not answer or the tier was degraded), error (the store raised).",
                labels=["reason"])
            for r, n in dropped.items():
                fam.add_metric([r], float(n))
            yield fam
        if "redis_tier_degraded" in s:
            yield GaugeMetricFamily("redis_tier_degraded", "1 while the shared KV tier is "
                                    "degraded (a recent call failed; it is skipped).",
                                    value=float(s["redis_tier_degraded"]))

    def _tenant_gauges(self, by_tenant: dict) -> Iterable[Metric]:
        """Pages held and quota per configured tenant (the key file fixes the set)."""
        pages = GaugeMetricFamily("tenant_kv_pages", "KV pages a tenant holds (live or "
                                  "cached), pages.", labels=["tenant"])
        quota = GaugeMetricFamily("tenant_kv_quota_pages", "A tenant's quota (over it, it "
                                  "evicts its own pages first), pages.", labels=["tenant"])
        for t in self.tenants or []:
            row = by_tenant.get(t, {})
            pages.add_metric([t], float(row.get("pages", 0)))
            if row.get("quota_pages") is not None:
                quota.add_metric([t], float(row["quota_pages"]))
        yield pages
        if quota.samples:
            yield quota


class ServerMetrics:
    """All metrics of one server.

    Args:
        tenants: the configured tenant ids (key file), or ``None`` for no tenant label.
    """

    def __init__(self, tenants: list[str] | None = None):
        disable_created_metrics()  # no *_created series (process-wide, as vLLM does)
        self.registry = CollectorRegistry(auto_describe=False)
        self.tenant_label = tenants is not None
        t = ("tenant",) if self.tenant_label else ()
        r = self.registry
        self.queries = Counter(
            "prefix_cache_queries", "Prompt tokens of requests whose cached_tokens became "
            "final (first token produced), tokens.", t, registry=r)
        self.hits = Counter(
            "prefix_cache_hits", "Of prefix_cache_queries, tokens read from the prefix "
            "cache: the sum of usage.prompt_tokens_details.cached_tokens, tokens.", t,
            registry=r)
        self.prompt_tokens = Counter(
            "prompt_tokens", "Prompt tokens of finished requests, tokens.", t, registry=r)
        self.generation_tokens = Counter(
            "generation_tokens", "Generated tokens of finished requests, tokens.", t,
            registry=r)
        self.finished = Counter(
            "request_success", "Finished requests by finish reason (abort: the client "
            "disconnected or cancelled).", t + ("finished_reason",), registry=r)
        self.rejected = Counter(
            "requests_rejected", "Requests answered with an error status, by HTTP status "
            "code.", ("code",), registry=r)
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time from request arrival to its first token, "
            "seconds.", buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(
            "inter_token_latency_seconds", "Time between two consecutive tokens of a "
            "request, seconds.", buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram(
            "e2e_request_latency_seconds", "Time from request arrival to its last output, "
            "seconds.", buckets=E2E_BUCKETS, registry=r)
        self.batch = Histogram(
            "engine_step_batch_requests", "Requests that produced a token in one engine "
            "step (the batch's decode width).", buckets=BATCH_BUCKETS, registry=r)
        self.engine_stats = EngineStatsCollector(tenants)
        r.register(self.engine_stats)
        for tenant in tenants or []:
            for c in (self.queries, self.hits, self.prompt_tokens, self.generation_tokens):
                c.labels(tenant)
            for reason in FINISH_REASONS:
                self.finished.labels(tenant, reason)
        if not self.tenant_label:
            for reason in FINISH_REASONS:
                self.finished.labels(reason)

    def _t(self, metric: Counter, tenant: str | None, *extra: str) -> Counter:
        if self.tenant_label:
            return metric.labels(tenant or "", *extra)
        return metric.labels(*extra) if extra else metric

    # -- engine thread -------------------------------------------------------------------
    def observe_output(self, st: StreamState, out: RequestOutput) -> None:
        """Account one output of a request (called on the engine thread)."""
        o = st.obs
        m = out.metrics
        tenant = st.spec.tenant
        n = out.outputs[0].num_tokens if out.outputs else 0
        if n > 0 and not o.get("counted"):
            o["counted"] = True
            self._t(self.queries, tenant).inc(len(out.prompt_token_ids))
            self._t(self.hits, tenant).inc(out.num_cached_tokens)
            if m is not None and m.first_token_time is not None:
                self.ttft.observe(max(0.0, m.first_token_time - m.arrival_time))
                o["last_t"] = m.first_token_time
            o["n"] = 1
        prev = o.get("n", 0)
        if n > prev > 0 and m is not None and m.last_token_time is not None and "last_t" in o:
            gap = max(0.0, (m.last_token_time - o["last_t"]) / (n - prev))
            for _ in range(n - prev):
                self.itl.observe(gap)
            o["last_t"] = m.last_token_time
            o["n"] = n
        if out.finished:
            reason = (out.outputs[0].finish_reason if out.outputs else None) or "error"
            if reason not in FINISH_REASONS:
                reason = "error"
            self._t(self.finished, tenant, reason).inc()
            self._t(self.prompt_tokens, tenant).inc(len(out.prompt_token_ids))
            self._t(self.generation_tokens, tenant).inc(sum(c.num_tokens for c in out.outputs))
            if m is not None and m.finished_time is not None:
                self.e2e.observe(max(0.0, m.finished_time - m.arrival_time))

    def observe_step(self, outputs: list[RequestOutput]) -> None:
        """One engine step's outputs: the number that carry a new token."""
        width = sum(1 for out in outputs
                    if out.outputs and out.outputs[0].num_tokens and
                    out.outputs[0].finish_reason not in ("abort", "error"))
        if width:
            self.batch.observe(width)

    # -- event loop --------------------------------------------------------------------
    def reject(self, status: int) -> None:
        self.rejected.labels(str(status)).inc()

    def render(self, engine_stats: dict[str, Any] | None) -> bytes:
        if engine_stats is not None:
            self.engine_stats.snapshot = dict(engine_stats)
        return generate_latest(self.registry)
