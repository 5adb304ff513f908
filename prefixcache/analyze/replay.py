"""Replaying tokenized requests through the cache core, with its replay driver
(:class:`prefixcache.cache.driver.ReplayDriver`: admit, take hits, allocate, commit,
record the query, publish the response, free), one request at a time in log order.
With ``per_model``, each request's ``model`` is folded into its namespace, as a
provider keeps one cache per model.

Capacity: ``capacity_tokens // block_size`` pages; ``None`` = unlimited (a page for
every prompt and response token of the log, so nothing is ever evicted). A request
larger than the whole pool cannot run: it counts as a query with 0 cached tokens and
``fits=False``. With ``ttl_seconds`` and timestamps, pages idle longer than the TTL
expire (:mod:`prefixcache.cache.expiry`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.cache.driver import ReplayDriver
from prefixcache.cache.expiry import IdleExpiry
from prefixcache.cache.manager import KVCacheManager


@dataclass
class CallResult:
    prompt_tokens: int
    cached_tokens: int
    response_tokens_published: int = 0
    fits: bool = True


@dataclass
class PageUse:
    """When a page's content (by hash) was first published and last used (s), and the
    index (in the log) of the request that first published it."""

    first: float
    last: float
    reads: int = 0
    request: int = 0


@dataclass
class ReplayResult:
    block_size: int
    num_pages: int
    capacity_tokens: int | None
    calls: list[CallResult]
    stats: dict
    expired_pages: int = 0
    prompt_hashes: list[list[bytes]] | None = None
    page_use: dict[bytes, PageUse] | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(c.prompt_tokens for c in self.calls)

    @property
    def cached_tokens(self) -> int:
        return sum(c.cached_tokens for c in self.calls)

    @property
    def hit_rate(self) -> float:
        p = self.prompt_tokens
        return self.cached_tokens / p if p else 0.0

    @property
    def failed(self) -> int:
        return sum(1 for c in self.calls if not c.fits)


def pages_for_all(requests: list[TokenizedRequest], block_size: int) -> int:
    """Pages that hold every prompt and response token of the log."""
    return max(1, sum(-(-(len(r.prompt_ids) + len(r.response_ids)) // block_size)
                      for r in requests))


@dataclass
class ReplayConfig:
    block_size: int = 16
    capacity_tokens: int | None = None
    publish_responses: bool = True
    ttl_seconds: float | None = None
    keep_hashes: bool = False
    track_page_use: bool = False
    model_id: str = field(default="")
    per_model: bool = False  # requests of different ``model``s never share pages


def replay(requests: list[TokenizedRequest], cfg: ReplayConfig | None = None,
           **kwargs) -> ReplayResult:
    """Replay ``requests`` through a fresh ``KVCacheManager``.

    Args:
        cfg: the settings (or pass :class:`ReplayConfig` fields as keywords).

    Raises:
        ValueError: ``block_size < 1`` or a capacity below one page.
    """
    cfg = cfg or ReplayConfig(**kwargs)
    bs = cfg.block_size
    if cfg.capacity_tokens is None:
        num_pages = pages_for_all(requests, bs)
    else:
        num_pages = cfg.capacity_tokens // bs
        if num_pages < 1:
            raise ValueError(f"capacity_tokens={cfg.capacity_tokens} is less than one "
                             f"page (block_size={bs})")
    mgr = KVCacheManager(num_pages, block_size=bs, model_id=cfg.model_id)
    expiry = IdleExpiry(mgr, cfg.ttl_seconds) if cfg.ttl_seconds else None
    calls: list[CallResult] = []
    hashes: list[list[bytes]] | None = [] if cfg.keep_hashes else None
    page_use: dict[bytes, PageUse] | None = {} if cfg.track_page_use else None
    driver = ReplayDriver(mgr, expiry=expiry)
    for r in requests:
        req = r.request
        now = req.timestamp
        prompt = r.prompt_ids
        # a provider keeps one cache per model: the model enters every page key
        extra = ("model", req.model) if cfg.per_model and req.model is not None else ()
        done = driver.serve(req.request_id, prompt, tenant=req.tenant,
                            cache_salt=req.cache_salt, extra_keys=extra, now=now,
                            response=r.response_ids if cfg.publish_responses else ())
        calls.append(CallResult(len(prompt), done.cached_tokens,
                                done.response_tokens_published, fits=done.fits))
        if not done.fits:
            if hashes is not None:
                hashes.append([])
            continue
        full = len(prompt) // bs
        ph = done.table.hashes  # prompt pages, then the published response's
        if hashes is not None:
            hashes.append(ph[:full])
        if page_use is not None:
            t = now if now is not None else float(len(calls) - 1)
            i = len(calls) - 1
            _use_pages(page_use, ph[:full], done.cached_tokens // bs, t, i)
            if done.response_tokens_published:
                _use_pages(page_use, ph[full:], 0, t, i)
    return ReplayResult(block_size=bs, num_pages=num_pages,
                        capacity_tokens=cfg.capacity_tokens, calls=calls,
                        stats=mgr.stats(), prompt_hashes=hashes, page_use=page_use,
                        expired_pages=expiry.expired_pages if expiry else 0)


def _use_pages(page_use: dict[bytes, PageUse], hashes: list[bytes], reads: int,
               t: float, request: int) -> None:
    """Record a use at ``t`` by log request ``request`` of pages by hash; the first
    ``reads`` were cache reads."""
    for i, h in enumerate(hashes):
        u = page_use.get(h)
        if u is None:
            page_use[h] = u = PageUse(t, t, request=request)
        u.last = t
        if i < reads:
            u.reads += 1


class ReplayCache:
    """Replays of one log, shared by everything that needs the same settings (the
    report, the sweeps, the price sheets). A stored replay serves any request for the
    same block size, capacity, response publishing and TTL that needs no more
    (``keep_hashes``, ``track_page_use``) than it kept.

    Args:
        analysis: the settings the user asked for (price modes may refer to them).
    """

    def __init__(self, requests: list[TokenizedRequest], analysis: ReplayConfig):
        self.requests = requests
        self.analysis = analysis
        self._done: list[tuple[ReplayConfig, ReplayResult]] = []
        self._timed = any(r.request.timestamp is not None for r in requests)
        self._models = len({r.request.model for r in requests}) > 1

    def _same(self, a: ReplayConfig, b: ReplayConfig) -> bool:
        def key(c: ReplayConfig) -> tuple:  # a TTL changes nothing without timestamps
            return (c.block_size, c.capacity_tokens, c.publish_responses,
                    c.ttl_seconds if self._timed else None, c.model_id,
                    c.per_model and self._models)
        return key(a) == key(b)

    def get(self, cfg: ReplayConfig) -> ReplayResult:
        for done_cfg, res in self._done:
            if self._same(done_cfg, cfg) and (done_cfg.keep_hashes or not cfg.keep_hashes) \
                    and (done_cfg.track_page_use or not cfg.track_page_use):
                return res
        res = replay(self.requests, cfg)
        self._done.append((cfg, res))
        return res

    @property
    def replays_run(self) -> int:
        return len(self._done)
