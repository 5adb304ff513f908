"""Prometheus metrics of the router (``GET /metrics``), on a registry per app.

Routing decisions by replica and reason; predicted against reported hits (tokens the
index predicted cached on the chosen replica, and ``usage.prompt_tokens_details.
cached_tokens`` as that replica reported it); upstream failures; and, at scrape time,
each replica's health, router-side load, and the index size and event-stream health.
Labels are bounded: the ``replica`` label is the replica's number (``--replica`` order).
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from prefixcache.router.replicas import ReplicaSet

REASONS = ("cache", "balance", "overload", "session")


class RouterMetrics:
    """Counters observed by the proxy, gauges read from the :class:`ReplicaSet`."""

    def __init__(self, replicas: ReplicaSet):
        disable_created_metrics()
        self.registry = CollectorRegistry()
        n = len(replicas.specs)
        reg = self.registry
        self.decisions = Counter("router_decisions", "Requests routed, by replica and "
                                 "reason (cache, balance, overload, session).",
                                 ["replica", "reason"], registry=reg)
        self.predicted = Counter("router_predicted_hit_tokens", "Prompt tokens the index "
                                 "predicted cached on the chosen replica, tokens.",
                                 ["replica"], registry=reg)
        self.reported = Counter("router_reported_cached_tokens", "usage cached_tokens as "
                                "the replica reported it, tokens.", ["replica"], registry=reg)
        self.prompt = Counter("router_prompt_tokens", "Prompt tokens routed, tokens.",
                              ["replica"], registry=reg)
        self.upstream_errors = Counter("router_upstream_errors", "Replica answers that "
                                       "made the router try another replica (connection "
                                       "errors, 429, 503).", ["replica"], registry=reg)
        self.no_replica = Counter("router_no_replica", "Requests answered 503: no healthy "
                                  "replica.", registry=reg)
        for i in range(n):
            for reason in REASONS:
                self.decisions.labels(str(i), reason)
            for c in (self.predicted, self.reported, self.prompt, self.upstream_errors):
                c.labels(str(i))
        reg.register(_ReplicaCollector(replicas))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ReplicaCollector:
    def __init__(self, replicas: ReplicaSet):
        self.replicas = replicas

    def collect(self) -> list[Metric]:
        rs = self.replicas
        healthy = GaugeMetricFamily("router_replica_healthy", "1 when the replica passes "
                                    "health checks.", labels=["replica"])
        queued = GaugeMetricFamily("router_replica_queued_tokens", "Tokens sent to the "
                                   "replica whose prefill has not completed, tokens.",
                                   labels=["replica"])
        running = GaugeMetricFamily("router_replica_running", "Requests sent to the "
                                    "replica and not finished.", labels=["replica"])
        gaps = CounterMetricFamily("router_kv_event_gaps", "Sequence gaps in the replica's "
                                   "KV events.", labels=["replica"])
        restarts = CounterMetricFamily("router_kv_event_restarts", "New incarnations seen "
                                       "on the replica's KV events.", labels=["replica"])
        with rs.lock:
            for i, load in enumerate(rs.loads):
                r = str(i)
                healthy.add_metric([r], float(load.healthy))
                queued.add_metric([r], load.queued_tokens)
                running.add_metric([r], load.running)
                sub = rs.subscribers[i]
                gaps.add_metric([r], sub.stream.gaps if sub else 0)
                restarts.add_metric([r], sub.stream.restarts if sub else 0)
            pages = GaugeMetricFamily("router_index_pages", "Page hashes in the router's "
                                      "index.", value=len(rs.index))
        return [healthy, queued, running, gaps, restarts, pages]
