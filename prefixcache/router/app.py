"""The router's FastAPI application: an OpenAI-compatible front for N replicas.

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (routed, streamed
through), ``GET /v1/models``, ``GET /health`` (503 when no replica is healthy),
``GET /metrics`` (Prometheus, :mod:`.metrics`). ``model`` is one of the replicas' served
names (or their ``--model``), as they report them (:mod:`.replica_info`). The app, its
error objects, body limit and draining shutdown are the HTTP foundation's
(:mod:`prefixcache.http`).

A request is authenticated with the same key file as the replicas (401 otherwise), parsed
and tokenized with the server's own preparer (the same 400s naming the field), hashed
into the engines' page hashes (``cache.page_keys.PromptKeys``), routed (:mod:`.replicas`,
:mod:`.policy`) and forwarded (:mod:`.proxy`). Replicas are health-checked every
``health_interval_s`` on ``GET /health``; one that did not answer ``GET /v1/cache/info``
at start is asked again with each health check and takes requests once its answer agrees;
one that comes back after a failed check, or whose KV events show a restart, is asked
again (and shut out if the new process serves another model or page size).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixcache.cache.page_keys import PromptKeys
from prefixcache.http.app import create_app, metrics_response, shutting_down
from prefixcache.http.auth import Authenticator
from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES
from prefixcache.http.drain import DEFAULT_GRACE_S, Drain
from prefixcache.http.errors import SERVER_ERROR, error_body
from prefixcache.router.metrics import RouterMetrics
from prefixcache.router.proxy import FORWARDED_HEADERS, Proxy
from prefixcache.router.replica_info import PATH as INFO_PATH
from prefixcache.router.replica_info import ReplicaInfo, headers_for, mismatch
from prefixcache.router.replicas import ReplicaSet, Routed
from prefixcache.server.bodies import parse_json, read_body
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from prefixcache.server.requests import RequestPreparer
from prefixcache.server.sessions import request_session

log = logging.getLogger(__name__)

RECHECK_S = 0.2  # how often the restart counts of the event streams are looked at


@dataclass
class RouterSettings:
    """What the router needs.

    Attributes:
        model_names: names accepted as ``model`` and listed by ``/v1/models`` (the first
            is reported; repeats are dropped, first occurrence kept): the replicas'.
        model_root: the replicas' ``--model``, accepted as ``model`` too, not listed.
        tokenizer: the replicas' tokenizer (chat template included).
        keys: the replicas' page hashing (:class:`PromptKeys`).
        auth: the replicas' API keys (default: single tenant).
        max_body_bytes: largest request body (413 beyond).
        health_interval_s: seconds between health checks of each replica.
        health_timeout_s: budget of one health check, seconds.
        replica_info: what every replica must report on ``GET /v1/cache/info`` to take
            requests (``None``: not checked).
        info_key: the API key the router sends there (``None``: none).
        shutdown_grace_s: how long running requests may continue after SIGTERM, seconds.
    """

    model_names: list[str]
    tokenizer: Any
    keys: PromptKeys
    model_root: str = ""
    auth: Authenticator = field(default_factory=Authenticator)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    replica_info: ReplicaInfo | None = None
    info_key: str | None = None
    shutdown_grace_s: float = DEFAULT_GRACE_S

    def __post_init__(self) -> None:
        self.model_names = list(dict.fromkeys(self.model_names))

    @property
    def accepted_names(self) -> list[str]:
        """Names accepted as ``model``: the listed ones, then ``model_root``."""
        root = [self.model_root] if self.model_root not in ("", *self.model_names) else []
        return self.model_names + root


@dataclass
class _Router:
    settings: RouterSettings
    replicas: ReplicaSet
    metrics: RouterMetrics
    preparer: RequestPreparer
    parse_pool: ThreadPoolExecutor
    proxy: Proxy | None = None
    client: httpx.AsyncClient | None = None
    refused: dict[int, str] = field(default_factory=dict)  # why a replica is shut out


def create_router_app(replicas: ReplicaSet, settings: RouterSettings) -> FastAPI:
    """The router app; health checks, event subscribers and the HTTP client start and
    stop with its lifespan."""
    metrics = RouterMetrics(replicas)
    preparer = RequestPreparer(tokenizer=settings.tokenizer, model_names=settings.accepted_names,
                               validate=lambda ids, params: None)  # the replica validates
    router = _Router(settings, replicas, metrics, preparer,
                     ThreadPoolExecutor(1, thread_name_prefix="prefixcache-router-parse"))
    app = create_app("prefixcache router", lifespan=_lifespan,
                     drain=Drain(settings.shutdown_grace_s))
    app.state.router = router
    for method, path, route in _ROUTES:
        app.add_api_route(path, route, methods=[method])
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    router: _Router = app.state.router
    app.state.drain.bind(asyncio.get_running_loop())
    router.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=2.0),
                                      limits=httpx.Limits(max_connections=None))
    router.proxy = Proxy(router.replicas, router.metrics, router.client)
    router.replicas.start_events()
    await _check_all(router)
    tasks = [asyncio.create_task(_health_loop(router)),
             asyncio.create_task(_recheck_loop(router))]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await router.client.aclose()
        router.replicas.stop_events()
        router.parse_pool.shutdown(wait=False)


async def _check_all(router: _Router) -> None:
    client = router.client
    assert client is not None
    s = router.settings

    async def one(i: int, url: str) -> None:
        try:
            ok = (await client.get(url + "/health", timeout=s.health_timeout_s)
                  ).status_code == 200
            rs = router.replicas
            if ok and not (rs.verified[i] and rs.loads[i].healthy):  # new, or back
                await _verify(router, i, url)
        except httpx.HTTPError:
            ok = False
        router.replicas.set_health(i, ok)

    await asyncio.gather(*(one(i, spec.url) for i, spec in enumerate(router.replicas.specs)))


async def _verify(router: _Router, i: int, url: str) -> bool:
    """Ask replica ``i`` for its ``GET /v1/cache/info`` and admit it if the answer agrees
    with the others', shut it out if not. ``False`` when it gave no answer (ask again).

    Raises:
        httpx.HTTPError: it cannot be reached.
    """
    want = router.settings.replica_info
    if want is None:
        router.replicas.set_verified(i, True)
        return True
    assert router.client is not None
    resp = await router.client.get(url + INFO_PATH, headers=headers_for(router.settings.info_key),
                                   timeout=router.settings.health_timeout_s)
    if resp.status_code >= 500:
        return False
    try:
        if resp.status_code != 200:
            raise ValueError(f"replica {url}: GET {INFO_PATH} answered {resp.status_code}")
        got = ReplicaInfo.from_json(url, resp.json())
    except ValueError as exc:
        why = str(exc)
    else:
        name = mismatch(want, got)
        if name is None:
            if not router.replicas.verified[i]:
                log.info("replica %d (%s) answered GET %s and agrees: it takes requests",
                         i, url, INFO_PATH)
            router.replicas.set_verified(i, True)
            return True
        why = (f"replica {url} disagrees on {name}: {got.field(name)!r}, the others have "
               f"{want.field(name)!r}")
    if router.replicas.verified[i] or why != router.refused.get(i):
        log.error("%s; replica %d takes no request", why, i)
    router.refused[i] = why
    router.replicas.set_verified(i, False)
    return True


async def _recheck_loop(router: _Router) -> None:
    """A replica whose KV events show a new incarnation is asked again what it serves:
    the restarted process may load another model or page size."""
    rs = router.replicas
    seen = [0] * len(rs.specs)
    while True:
        await asyncio.sleep(RECHECK_S)
        for i, spec in enumerate(rs.specs):
            sub = rs.subscribers[i]
            restarts = sub.stream.restarts if sub is not None else 0
            if restarts != seen[i]:
                with contextlib.suppress(httpx.HTTPError):
                    if await _verify(router, i, spec.url):
                        seen[i] = restarts


async def _health_loop(router: _Router) -> None:
    while True:
        await asyncio.sleep(router.settings.health_interval_s)
        await _check_all(router)


def _router(request: Request) -> _Router:
    return request.app.state.router


async def _routed(request: Request, path: str, body_type: type) -> Response:
    router = _router(request)
    s = router.settings
    arrival = time.perf_counter()
    principal = s.auth.authenticate(request.headers.get("authorization"))
    raw = await read_body(request, s.max_body_bytes)
    req = await parse_json(body_type, raw, router.parse_pool)
    if isinstance(req, ChatCompletionRequest):
        prep = await router.preparer.chat(req, arrival)
    else:
        assert isinstance(req, CompletionRequest)
        prep = await router.preparer.completion(req, arrival)
    ids = prep.prompts[0][0]
    hashes = s.keys.page_hashes(ids, principal.tenant, prep.cache_salt)
    total = sum(len(p) for p, _ in prep.prompts)
    sid = request_session(req.session_id, req.prompt_cache_key, request.headers)
    session = None if sid is None else (principal.tenant, sid)

    def route(exclude: Sequence[int]) -> Routed | None:
        return router.replicas.route(hashes, total, s.keys.block_size, exclude, session)

    headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
    assert router.proxy is not None
    return await router.proxy.send(path, raw, headers, route)


async def completions(request: Request) -> Response:
    return await _routed(request, "/v1/completions", CompletionRequest)


async def chat_completions(request: Request) -> Response:
    return await _routed(request, "/v1/chat/completions", ChatCompletionRequest)


async def models(request: Request) -> JSONResponse:
    s = _router(request).settings
    s.auth.authenticate(request.headers.get("authorization"))
    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "owned_by": "prefixcache"} for name in s.model_names]})


async def health(request: Request) -> Response:
    if request.app.state.drain.draining:
        return shutting_down(request)
    rs = _router(request).replicas
    body = {"replicas": [{"url": spec.url, "healthy": load.healthy}
                         for spec, load in zip(rs.specs, rs.loads)]}
    if not rs.any_healthy:
        return JSONResponse({**error_body("no healthy replica", type=SERVER_ERROR,
                                          code="no_healthy_replica"), **body}, status_code=503)
    return JSONResponse({"status": "ok", **body})


async def prometheus_metrics(request: Request) -> Response:
    return metrics_response(_router(request).metrics.render())


_ROUTES = (("POST", "/v1/completions", completions),
           ("POST", "/v1/chat/completions", chat_completions),
           ("GET", "/v1/models", models), ("GET", "/health", health),
           ("GET", "/metrics", prometheus_metrics))
