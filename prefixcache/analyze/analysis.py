"""The whole analysis of a log, as one JSON-ready report (``prefixcache analyze``).

Steps: tokenize (:mod:`.encode`); replay at the asked block size and capacity and with
an unlimited cache (:mod:`.replay`); sweep block sizes and capacities (:mod:`.sweep`);
find cache breakers (:mod:`.breakers`); summarize the prefix tree (:mod:`.tree`);
price the log (:mod:`.cost`); compare with recorded usage (:mod:`.validate`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.analyze.breakers import find_breakers, group_breakers
from prefixcache.analyze.cost import price_sheet
from prefixcache.analyze.encode import EncodeInfo, encode_requests
from prefixcache.analyze.model_rows import check_model_map
from prefixcache.analyze.pricing import load_price_specs
from prefixcache.analyze.records import Request, TokenizedRequest
from prefixcache.analyze.replay import ReplayCache, ReplayConfig, ReplayResult
from prefixcache.analyze.sweep import (
    BLOCK_SIZES,
    block_size_sweep,
    capacity_points,
    capacity_sweep,
    fitting_block_sizes,
)
from prefixcache.analyze.tree import summarize_tree
from prefixcache.analyze.validate import compare_recorded

REPORT_VERSION = 1


@dataclass
class AnalyzeOptions:
    block_size: int = 16
    capacity_tokens: int | None = None
    kv_bytes_per_token: int | None = None
    publish_responses: bool = True
    ttl_seconds: float | None = None
    template: str = "auto"
    prices: list[str] | None = None
    price_overrides: dict | None = None
    price_models: dict[str, str] | None = None  # log model -> sheet row (--price-model)
    top_breakers: int = 10
    top_prefixes: int = 10
    block_sizes: tuple[int, ...] = BLOCK_SIZES
    sweeps: bool = True
    costs: bool = True
    inputs: list[str] = field(default_factory=list)


def _rate(c: int, p: int) -> float:
    return c / p if p else 0.0


def _group(rows, key) -> dict:
    out: dict = {}
    for tr, c, cu in rows:
        g = out.setdefault(key(tr), {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0,
                                     "cached_tokens_unbounded": 0})
        g["requests"] += 1
        g["prompt_tokens"] += c.prompt_tokens
        g["cached_tokens"] += c.cached_tokens
        g["cached_tokens_unbounded"] += cu.cached_tokens
    for g in out.values():
        g["hit_rate"] = _rate(g["cached_tokens"], g["prompt_tokens"])
        g["hit_rate_unbounded"] = _rate(g["cached_tokens_unbounded"], g["prompt_tokens"])
    return out


def _calls(trs: list[TokenizedRequest], main: ReplayResult, unb: ReplayResult) -> list[dict]:
    out = []
    for tr, c, cu in zip(trs, main.calls, unb.calls):
        r = tr.request
        out.append({
            "request_id": r.request_id, "tenant": r.tenant, "conversation": r.conversation,
            "turn": r.turn, "timestamp": r.timestamp, "prompt_tokens": c.prompt_tokens,
            "cached_tokens": c.cached_tokens, "hit_rate": _rate(c.cached_tokens, c.prompt_tokens),
            "cached_tokens_unbounded": cu.cached_tokens,
            "response_tokens": len(tr.response_ids), "fits": c.fits,
            "recorded": r.usage.as_dict() if r.usage else None,
        })
    return out


def analyze_tokenized(trs: list[TokenizedRequest], info: EncodeInfo, opts: AnalyzeOptions,
                      tokenizer=None) -> dict:
    """The report for already tokenized requests (see :func:`analyze_requests`)."""
    cfg = ReplayConfig(block_size=opts.block_size, capacity_tokens=opts.capacity_tokens,
                       publish_responses=opts.publish_responses, ttl_seconds=opts.ttl_seconds)
    replays = ReplayCache(trs, cfg)
    unb = replays.get(ReplayConfig(**{**cfg.__dict__, "capacity_tokens": None,
                                      "keep_hashes": True, "track_page_use": True}))
    main = replays.get(cfg)
    rows = list(zip(trs, main.calls, unb.calls))
    tenants = _group(rows, lambda tr: tr.tenant or "")
    turns = _group(rows, lambda tr: tr.request.turn)
    report: dict = {
        "version": REPORT_VERSION, "inputs": list(opts.inputs), **info.as_dict(),
        "block_size": opts.block_size, "capacity_tokens": opts.capacity_tokens,
        "kv_bytes_per_token": opts.kv_bytes_per_token,
        "capacity_bytes": (opts.capacity_tokens * opts.kv_bytes_per_token
                           if opts.capacity_tokens and opts.kv_bytes_per_token else None),
        "num_pages": main.num_pages, "publish_responses": opts.publish_responses,
        "ttl_seconds": opts.ttl_seconds,
        "requests": len(trs), "prompt_tokens": main.prompt_tokens,
        "cached_tokens": main.cached_tokens, "hit_rate": main.hit_rate,
        "cached_tokens_unbounded": unb.cached_tokens, "hit_rate_unbounded": unb.hit_rate,
        "response_tokens": sum(len(t.response_ids) for t in trs),
        "response_tokens_published": sum(c.response_tokens_published for c in main.calls),
        "failed_requests": main.failed, "evictions": main.stats["evictions"],
        "expired_pages": main.expired_pages,
        "footprint_tokens": unb.stats["published_pages"] * opts.block_size,
        "tenants": tenants,
        "turns": [{"turn": k, **v} for k, v in sorted(turns.items())],
        "calls": _calls(trs, main, unb),
    }
    if opts.sweeps and trs:
        caps = capacity_points(unb.stats["published_pages"], opts.block_size,
                               opts.capacity_tokens)
        _, skipped = fitting_block_sizes(opts.capacity_tokens, opts.block_sizes)
        report["sweeps"] = {
            "block_size": [p.as_dict() for p in block_size_sweep(replays, cfg,
                                                                  opts.block_sizes)],
            "block_size_skipped": skipped,
            "working_set_pages": unb.stats["published_pages"],
            "capacity": [p.as_dict() for p in capacity_sweep(replays, cfg, caps)],
        }
    breakers = find_breakers(trs, [c.cached_tokens for c in unb.calls], opts.block_size,
                             tokenizer, publish_responses=opts.publish_responses)
    groups = group_breakers(breakers, opts.top_breakers)
    report["breakers"] = {"requests": len(breakers),
                          "tokens_cost": sum(b.tokens_cost for b in breakers),
                          "groups": [g.as_dict() for g in groups]}
    report["tree"] = summarize_tree(trs, unb.prompt_hashes or [], opts.block_size, tokenizer,
                                    opts.top_prefixes).as_dict()
    if opts.costs:
        specs = load_price_specs(opts.prices)
        model_map = opts.price_models or {}
        check_model_map(model_map, [sheet for sheet, _ in specs])
        report["costs"] = [c.as_dict() for sheet, pinned in specs
                           for c in price_sheet(trs, sheet, replays, pinned, model_map,
                                                opts.price_overrides)]
    report["validation"] = compare_recorded(trs, main)
    report["replays_run"] = replays.replays_run
    return report


def analyze_requests(requests: list[Request], tokenizer, opts: AnalyzeOptions) -> dict:
    """Tokenize ``requests`` and build the report (the ``--json`` content)."""
    trs, info = encode_requests(requests, tokenizer, opts.template)
    return analyze_tokenized(trs, info, opts, tokenizer)
