"""Cost of a log under a price sheet: flat price and cache-aware price.

Per call, with P prompt tokens, C tokens billed as cache reads, W as cache writes and
O output tokens (recorded ``completion_tokens`` when the log has usage, else the
tokenized recorded response, else 0):

- flat = P x input + O x output (no caching);
- cache-aware = (P - C - W) x input + C x read + W x write + O x output, plus storage
  for explicit caches.

Each request is billed at its own model's row of the sheet (:mod:`.model_rows`; the
report names every substitution). C and W come from the mode (see :mod:`.pricing`):
``automatic`` and ``explicit`` replay the log through the cache core with the provider's
unit as block size (unlimited capacity and one cache per model unless
``use_analysis_cache``) and its idle TTL; a hit shorter than
``min_cached_tokens`` is billed as a miss. ``breakpoints`` uses the breakpoint model
(:mod:`.breakpoints`). ``explicit`` adds storage: every page read at least once is
stored from its first write until one TTL after its last use (one TTL per page when the
log has no timestamps), ``storage_token_hours`` x the storage price.

With hit share h = C / P and read ratio r = read / input, and no writes or storage,
the flat input cost overstates the cache-aware one by exactly 1 / (h r + 1 - h)
(``formula_ratio``; ``input_ratio`` is the measured one).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from prefixcache.analyze.breakpoints import BreakpointCache
from prefixcache.analyze.model_rows import RowChoice, choose_rows
from prefixcache.analyze.pricing import Prices, resolve, sheet_overrides
from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.replay import ReplayCache, ReplayConfig, ReplayResult

BY_MODEL = "by-model"  # the label's model when requests are priced at several rows


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
    per_model: dict[str | None, TenantCost] = field(default_factory=dict)
    rows: list[RowChoice] = field(default_factory=list)
    per_call_cached: list[int] = field(default_factory=list)
    per_call_write: list[int] = field(default_factory=list)
    recorded: dict | None = None
    _read_price: float = 0.0  # sum of prompt tokens x each request's read price

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
    def read_ratio(self) -> float:
        """r: read price over input price (several rows: weighted by prompt tokens)."""
        if self.prices.model != BY_MODEL:
            return self.prices.read_ratio
        return self._read_price / self.flat_input if self.flat_input else 0.0

    @property
    def formula_ratio(self) -> float:
        """1 / (h r + 1 - h): flat input over cache-aware input without writes."""
        h, r = self.hit_share, self.read_ratio
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
            "price_per_mtok": None if p.model == BY_MODEL else {
                "input": p.input * 1e6, "read": p.read * 1e6, "write": p.write * 1e6,
                "output": p.output * 1e6, "storage_per_hour": p.storage_per_token_hour * 1e6},
            "requests": self.requests, "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens, "write_tokens": self.write_tokens,
            "output_tokens": self.output_tokens, "output_source": self.output_source,
            "flat": self.flat, "cache_aware": self.cache_aware, "savings": self.savings,
            "flat_input": self.flat_input, "cache_aware_input": self.aware_input,
            "storage": self.storage, "storage_token_hours": self.storage_token_hours,
            "hit_share": self.hit_share, "read_ratio": self.read_ratio,
            "ratio": self.ratio, "input_ratio": self.input_ratio,
            "formula_ratio": self.formula_ratio,
            "per_tenant": {k: v.as_dict() for k, v in self.per_tenant.items()},
            "models": [{**c.as_dict(), **_model_cost(self.per_model, c.model)}
                       for c in self.rows],
            "substitutions": [c.as_dict() for c in self.rows if c.substituted],
            "recorded": self.recorded,
        }


def _model_cost(per_model: dict, model: str | None) -> dict:
    t = per_model.get(model)
    if t is None:
        return {}
    return {"prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
            "flat": t.flat, "cache_aware": t.cache_aware}


def output_tokens(tr: TokenizedRequest) -> tuple[int, str]:
    u = tr.request.usage
    if u is not None:
        return u.completion_tokens, "recorded usage"
    if tr.response_ids:
        return len(tr.response_ids), "response tokens"
    return 0, "none"


def replay_for_prices(replays: ReplayCache, p: Prices) -> ReplayResult:
    """The replay whose hits a price mode bills: the provider's unit as block size, an
    unlimited cache per model with its idle TTL; or the analysis cache
    (``use_analysis_cache``)."""
    a = replays.analysis
    if p.use_analysis_cache:
        cfg = ReplayConfig(**{**a.__dict__, "keep_hashes": False,
                              "track_page_use": p.kind == "explicit"})
    else:
        cfg = ReplayConfig(block_size=p.unit_tokens or a.block_size, capacity_tokens=None,
                           publish_responses=a.publish_responses, ttl_seconds=p.ttl_seconds,
                           track_page_use=p.kind == "explicit", per_model=True)
    return replays.get(cfg)


def _breakpoint_calls(requests: list[TokenizedRequest], each: list[Prices]
                      ) -> tuple[list[int], list[int]]:
    """Reads and writes per call under the breakpoint model, one cache per log model
    (a provider never shares a cache between models; the same key as the replay's)."""
    caches: dict[str | None, BreakpointCache] = {}
    cached, writes = [], []
    for tr, pr in zip(requests, each):
        r = tr.request
        bc = caches.get(r.model)
        if bc is None:
            bc = caches[r.model] = BreakpointCache(pr.max_breakpoints, pr.min_cached_tokens,
                                                    pr.ttl_seconds)
        call = bc.call((r.tenant, r.cache_salt), tr.prompt_ids, tr.boundaries,
                       tr.boundary_roles, r.timestamp)
        cached.append(call.read)
        writes.append(call.write)
    return cached, writes


def price_log(requests: list[TokenizedRequest], p: Prices, replays: ReplayCache,
              per_request: list[Prices] | None = None,
              rows: list[RowChoice] | None = None) -> CostResult:
    """Flat and cache-aware cost of the log under ``p``.

    Args:
        p: the mode's prices (the label's row when ``per_request`` is given).
        per_request: the prices of each request's own row, same mode as ``p``
            (default: ``p`` for every request).
        rows: how the rows were chosen, per log model (reported as ``models``).
    """
    each = per_request if per_request is not None else [p] * len(requests)
    if len(each) != len(requests):
        raise ValueError(f"per_request has {len(each)} prices for {len(requests)} requests")
    res = CostResult(prices=p, requests=len(requests), rows=list(rows or []))
    cached: list[int]
    writes: list[int]
    if p.kind == "breakpoints":
        cached, writes = _breakpoint_calls(requests, each)
    else:
        rr = replay_for_prices(replays, p)
        cached = [c.cached_tokens if c.cached_tokens >= pr.min_cached_tokens else 0
                  for c, pr in zip(rr.calls, each)]
        writes = [0] * len(requests)
        if p.kind == "explicit" and rr.page_use is not None:
            unit = rr.block_size
            timed = all(tr.request.timestamp is not None for tr in requests)
            ttl = p.ttl_seconds or 0.0
            held = [(((u.last - u.first) if timed else 0.0) + ttl, u.request)
                    for u in rr.page_use.values() if u.reads > 0]
            res.storage_token_hours = unit * sum(s for s, _ in held) / 3600.0
            # each page at the storage rate of the model whose request stored it
            res.storage = sum(unit * s / 3600.0 * each[i].storage_per_token_hour
                              for s, i in held)
    sources = set()
    for tr, c, w, pr in zip(requests, cached, writes, each):
        n_prompt = len(tr.prompt_ids)
        out, src = output_tokens(tr)
        sources.add(src)
        flat_in = n_prompt * pr.input
        aware_in = (n_prompt - c - w) * pr.input + c * pr.read + w * pr.write
        res.prompt_tokens += n_prompt
        res.cached_tokens += c
        res.write_tokens += w
        res.output_tokens += out
        res.flat_input += flat_in
        res.flat_output += out * pr.output
        res.aware_input += aware_in
        res._read_price += n_prompt * pr.read
        for t in (res.per_tenant.setdefault(tr.tenant or "", TenantCost()),
                  res.per_model.setdefault(tr.request.model, TenantCost())):
            t.requests += 1
            t.prompt_tokens += n_prompt
            t.cached_tokens += c
            t.flat += flat_in + out * pr.output
            t.cache_aware += aware_in + out * pr.output
    res.per_call_cached, res.per_call_write = cached, writes
    res.output_source = sources.pop() if len(sources) == 1 else ("mixed" if sources else "none")
    res.recorded = recorded_cost(requests, p, each)
    return res


def price_sheet(requests: list[TokenizedRequest], sheet: dict, replays: ReplayCache,
                pinned: str | None = None, model_map: dict[str, str] | None = None,
                overrides: dict | None = None) -> list[CostResult]:
    """One :class:`CostResult` per mode of ``sheet``, each request priced by its own
    model's row (see :mod:`.model_rows`; ``pinned``: one row for all).

    Raises:
        PriceSheetError: a row the sheet does not have.
    """
    row_of, rows = choose_rows(sheet, [tr.request.model for tr in requests], model_map,
                               pinned)
    ov = sheet_overrides(sheet, overrides)
    by_row = {row: resolve(sheet, row, ov) for row in dict.fromkeys(row_of)}
    label_row = row_of[0] if len(by_row) == 1 else None
    out = []
    for i, mode_p in enumerate(resolve(sheet, pinned, ov)):
        each = [by_row[row][i] for row in row_of]
        p = by_row[label_row][i] if label_row else replace(mode_p, model=BY_MODEL)
        out.append(price_log(requests, p, replays, each, rows))
    return out


def recorded_cost(requests: list[TokenizedRequest], p: Prices,
                  per_request: list[Prices] | None = None) -> dict | None:
    """The log's own usage priced under ``p`` (or each request's ``per_request``
    prices), for requests whose usage comes from the same provider (``None`` if there
    are none)."""
    each = per_request if per_request is not None else [p] * len(requests)
    rows = [(tr.request, u, pr) for tr, pr in zip(requests, each)
            if (u := tr.request.usage) is not None and u.provider == p.provider]
    if not rows:
        return None
    prompt = cached = write = out = 0
    cost = 0.0
    logged = [r.extra["recorded_cost"] for r, _, _ in rows if "recorded_cost" in r.extra]
    for _, u, pr in rows:
        prompt += u.prompt_tokens
        cached += u.cached_tokens
        write += u.cache_write_tokens
        out += u.completion_tokens
        cost += ((u.prompt_tokens - u.cached_tokens - u.cache_write_tokens) * pr.input
                 + u.cached_tokens * pr.read + u.cache_write_tokens * pr.write
                 + u.completion_tokens * pr.output)
    return {"requests": len(rows), "prompt_tokens": prompt, "cached_tokens": cached,
            "write_tokens": write, "output_tokens": out, "cost": cost,
            "hit_rate": cached / prompt if prompt else 0.0,
            "logged_cost": sum(logged) if logged else None}
