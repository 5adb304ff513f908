"""Cost of a log under a price sheet: flat price and cache-aware price.

Per call, with P prompt tokens, C tokens billed as cache reads, W as cache writes and
O output tokens (recorded ``completion_tokens`` when the log has usage, else the
tokenized recorded response, else 0):

- flat = P x input + O x output (no caching);
- cache-aware = (P - C - W) x input + C x read + W x write + O x output, plus storage
  for explicit caches.

C and W come from the mode (see :mod:`.pricing`): ``automatic`` and ``explicit`` replay
the log through the cache core with the provider's unit as block size (unlimited
capacity unless ``use_analysis_cache``) and its idle TTL; a hit shorter than
``min_cached_tokens`` is billed as a miss. ``breakpoints`` uses the breakpoint model
(:mod:`.breakpoints`). ``explicit`` adds storage: every page read at least once is
stored from its first write until one TTL after its last use (one TTL per page when the
log has no timestamps), ``storage_token_hours`` x the storage price.

With hit share h = C / P and read ratio r = read / input, and no writes or storage,
the flat input cost overstates the cache-aware one by exactly 1 / (h r + 1 - h)
(``formula_ratio``; ``input_ratio`` is the measured one).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.analyze.breakpoints import BreakpointCache
from prefixcache.analyze.pricing import Prices
from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.replay import ReplayCache, ReplayConfig, ReplayResult


@dataclass
class TenantCost:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    flat: float = 0.0
    cache_aware: float = 0.0

    @property
    def savings(self) -> float:
        return self.flat - self.cache_aware

    def as_dict(self) -> dict:
        return {**self.__dict__, "savings": self.savings}


@dataclass
class CostResult:
    prices: Prices
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    write_tokens: int = 0
    output_tokens: int = 0
    output_source: str = "none"
    flat_input: float = 0.0
    flat_output: float = 0.0
    aware_input: float = 0.0
    storage: float = 0.0
    storage_token_hours: float = 0.0
    per_tenant: dict[str, TenantCost] = field(default_factory=dict)
    per_call_cached: list[int] = field(default_factory=list)
    per_call_write: list[int] = field(default_factory=list)
    recorded: dict | None = None

    @property
    def flat(self) -> float:
        return self.flat_input + self.flat_output

    @property
    def cache_aware(self) -> float:
        return self.aware_input + self.flat_output + self.storage

    @property
    def savings(self) -> float:
        return self.flat - self.cache_aware

    @property
    def hit_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def formula_ratio(self) -> float:
        """1 / (h r + 1 - h): flat input over cache-aware input without writes."""
        h, r = self.hit_share, self.prices.read_ratio
        return 1.0 / (h * r + 1.0 - h) if (h * r + 1.0 - h) > 0 else float("inf")

    @property
    def input_ratio(self) -> float:
        return self.flat_input / self.aware_input if self.aware_input else float("inf")

    @property
    def ratio(self) -> float:
        return self.flat / self.cache_aware if self.cache_aware else float("inf")

    def as_dict(self) -> dict:
        p = self.prices
        return {
            "label": p.label, "provider": p.provider, "model": p.model, "mode": p.mode,
            "kind": p.kind, "currency": p.currency, "source": p.source, "as_of": p.as_of,
            "price_per_mtok": {"input": p.input * 1e6, "read": p.read * 1e6,
                               "write": p.write * 1e6, "output": p.output * 1e6,
                               "storage_per_hour": p.storage_per_token_hour * 1e6},
            "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "write_tokens": self.write_tokens,
            "output_tokens": self.output_tokens, "output_source": self.output_source,
            "flat": self.flat, "cache_aware": self.cache_aware, "savings": self.savings,
            "flat_input": self.flat_input, "cache_aware_input": self.aware_input,
            "storage": self.storage, "storage_token_hours": self.storage_token_hours,
            "hit_share": self.hit_share, "read_ratio": p.read_ratio,
            "ratio": self.ratio, "input_ratio": self.input_ratio,
            "formula_ratio": self.formula_ratio,
            "per_tenant": {k: v.as_dict() for k, v in self.per_tenant.items()},
            "recorded": self.recorded,
        }


def output_tokens(tr: TokenizedRequest) -> tuple[int, str]:
    u = tr.request.usage
    if u is not None:
        return u.completion_tokens, "recorded usage"
    if tr.response_ids:
        return len(tr.response_ids), "response tokens"
    return 0, "none"


def replay_for_prices(replays: ReplayCache, p: Prices) -> ReplayResult:
    """The replay whose hits a price mode bills: the provider's unit as block size, an
    unlimited cache with its idle TTL; or the analysis cache (``use_analysis_cache``)."""
    a = replays.analysis
    if p.use_analysis_cache:
        cfg = ReplayConfig(**{**a.__dict__, "keep_hashes": False,
                              "track_page_use": p.kind == "explicit"})
    else:
        cfg = ReplayConfig(block_size=p.unit_tokens or a.block_size, capacity_tokens=None,
                           publish_responses=a.publish_responses, ttl_seconds=p.ttl_seconds,
                           track_page_use=p.kind == "explicit")
    return replays.get(cfg)


def price_log(requests: list[TokenizedRequest], p: Prices, replays: ReplayCache) -> CostResult:
    """Flat and cache-aware cost of the log under ``p``."""
    res = CostResult(prices=p, requests=len(requests))
    cached: list[int]
    writes: list[int]
    if p.kind == "breakpoints":
        bc = BreakpointCache(p.max_breakpoints, p.min_cached_tokens, p.ttl_seconds)
        cached, writes = [], []
        for tr in requests:
            r = tr.request
            call = bc.call((r.tenant, r.cache_salt), tr.prompt_ids, tr.boundaries,
                           tr.boundary_roles, r.timestamp)
            cached.append(call.read)
            writes.append(call.write)
    else:
        rr = replay_for_prices(replays, p)
        cached = [c.cached_tokens if c.cached_tokens >= p.min_cached_tokens else 0
                  for c in rr.calls]
        writes = [0] * len(requests)
        if p.kind == "explicit" and rr.page_use is not None:
            unit = rr.block_size
            timed = all(tr.request.timestamp is not None for tr in requests)
            ttl = p.ttl_seconds or 0.0
            secs = sum(((u.last - u.first) if timed else 0.0) + ttl
                       for u in rr.page_use.values() if u.reads > 0)
            res.storage_token_hours = unit * secs / 3600.0
            res.storage = res.storage_token_hours * p.storage_per_token_hour
    sources = set()
    for tr, c, w in zip(requests, cached, writes):
        n_prompt = len(tr.prompt_ids)
        out, src = output_tokens(tr)
        sources.add(src)
        flat_in = n_prompt * p.input
        aware_in = (n_prompt - c - w) * p.input + c * p.read + w * p.write
        res.prompt_tokens += n_prompt
        res.cached_tokens += c
        res.write_tokens += w
        res.output_tokens += out
        res.flat_input += flat_in
        res.flat_output += out * p.output
        res.aware_input += aware_in
        t = res.per_tenant.setdefault(tr.tenant or "", TenantCost())
        t.requests += 1
        t.prompt_tokens += n_prompt
        t.cached_tokens += c
        t.flat += flat_in + out * p.output
        t.cache_aware += aware_in + out * p.output
    res.per_call_cached, res.per_call_write = cached, writes
    res.output_source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    res.recorded = recorded_cost(requests, p)
    return res


def recorded_cost(requests: list[TokenizedRequest], p: Prices) -> dict | None:
    """The log's own usage priced under ``p``, for requests whose usage comes from the
    same provider (``None`` if there are none)."""
    rows = [(tr.request, u) for tr in requests
            if (u := tr.request.usage) is not None and u.provider == p.provider]
    if not rows:
        return None
    prompt = cached = write = out = 0
    cost = 0.0
    logged = [r.extra["recorded_cost"] for r, _ in rows if "recorded_cost" in r.extra]
    for _, u in rows:
        prompt += u.prompt_tokens
        cached += u.cached_tokens
        write += u.cache_write_tokens
        out += u.completion_tokens
        cost += ((u.prompt_tokens - u.cached_tokens - u.cache_write_tokens) * p.input
                 + u.cached_tokens * p.read + u.cache_write_tokens * p.write
                 + u.completion_tokens * p.output)
    return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
            "write_tokens": write, "output_tokens": out, "cost": cost,
            "hit_rate": cached / prompt if prompt else 0.0,
            "logged_cost": sum(logged) if logged else None}
