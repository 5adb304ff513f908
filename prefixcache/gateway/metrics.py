"""Per-tenant gateway counters: hits per layer, tokens, cost with and without each layer.

Served as Prometheus text on ``/metrics`` (labels: tenant names, never keys) and as JSON
on ``GET /v1/gateway/stats`` (a caller sees its own tenant; an admin key sees all).

Cost scenarios per tenant, in the price sheets' currency (USD):

- ``actual``: what the upstreams billed (normalised usage, priced);
- ``without_exact``: ``actual`` plus, for each layer-1 (or layer-2) hit, what the stored
  answer cost when it was computed: what the tenant would pay without the response caches;
- ``without_prefix``: as ``without_exact`` but every prompt token at the uncached input
  price: no response cache and no upstream prefix cache.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest

from prefixcache.gateway.accounting import NormalUsage

LAYERS = ("exact", "semantic", "miss", "bypass", "error")


@dataclass
class TenantStats:
    requests: dict
    upstream_calls: int = 0
    uncached_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0
    output_tokens: int = 0
    tokens_saved: int = 0          # upstream prompt+output tokens not sent (layer 1/2 hits)
    volatile_prefixes: int = 0
    rewritten_history_tokens: int = 0
    cost_actual: float = 0.0
    cost_without_exact: float = 0.0
    cost_without_prefix: float = 0.0


def _label(tenant: str | None) -> str:
    return "(single-tenant)" if tenant is None else tenant


def _new() -> TenantStats:
    return TenantStats(requests={k: 0 for k in LAYERS})


class GatewayMetrics:
    def __init__(self) -> None:
        self.tenants: dict[str, TenantStats] = defaultdict(_new)
        self.registry = CollectorRegistry()
        self._requests = Counter("prefixcache_gateway_requests", "requests by serving layer",
                                 ["tenant", "layer"], registry=self.registry)
        self._tokens = Counter("prefixcache_gateway_upstream_tokens",
                               "upstream tokens by kind", ["tenant", "kind"],
                               registry=self.registry)
        self._cost = Counter("prefixcache_gateway_cost_usd", "cost by scenario",
                             ["tenant", "scenario"], registry=self.registry)
        self._breakers = Counter("prefixcache_gateway_prefix_breakers",
                                 "volatile prefixes and rewritten-history tokens",
                                 ["tenant", "kind"], registry=self.registry)

    def request(self, tenant: str | None, layer: str) -> None:
        t = _label(tenant)
        self.tenants[t].requests[layer] += 1
        self._requests.labels(t, layer).inc()

    def upstream(self, tenant: str | None, u: NormalUsage, cost: float, uncached: float
                 ) -> None:
        t = _label(tenant)
        s = self.tenants[t]
        s.upstream_calls += 1
        for kind, n in (("uncached", u.uncached), ("cache_read", u.cache_read),
                        ("cache_write_5m", u.write_5m), ("cache_write_1h", u.write_1h),
                        ("output", u.output)):
            attr = f"{kind}_tokens" if kind != "uncached" else "uncached_tokens"
            setattr(s, attr, getattr(s, attr) + n)
            self._tokens.labels(t, kind).inc(n)
        self._add_cost(t, cost, cost, uncached)

    def saved(self, tenant: str | None, u: NormalUsage, cost: float, uncached: float) -> None:
        """A layer-1/2 hit: the upstream call (of usage ``u``) that was not made."""
        t = _label(tenant)
        self.tenants[t].tokens_saved += u.prompt + u.output
        self._add_cost(t, 0.0, cost, uncached)

    def breaker(self, tenant: str | None, volatile: bool, rewritten_tokens: int) -> None:
        t = _label(tenant)
        if volatile:
            self.tenants[t].volatile_prefixes += 1
            self._breakers.labels(t, "volatile_prefix").inc()
        if rewritten_tokens:
            self.tenants[t].rewritten_history_tokens += rewritten_tokens
            self._breakers.labels(t, "rewritten_history_tokens").inc(rewritten_tokens)

    def _add_cost(self, t: str, actual: float, without_exact: float, without_prefix: float
                  ) -> None:
        s = self.tenants[t]
        s.cost_actual += actual
        s.cost_without_exact += without_exact
        s.cost_without_prefix += without_prefix
        for name, v in (("actual", actual), ("without_exact", without_exact),
                        ("without_prefix", without_prefix)):
            self._cost.labels(t, name).inc(v)

    def stats(self, tenant: str | None, admin: bool) -> dict:
        if admin:
            return {t: asdict(s) for t, s in sorted(self.tenants.items())}
        t = _label(tenant)
        return {t: asdict(self.tenants[t])}

    def render(self) -> bytes:
        return generate_latest(self.registry)
