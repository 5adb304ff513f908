"""The FastAPI application: routes, authentication, body limits and error mapping.

Routes:
    ``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI, streaming or not),
    ``POST /v1/messages`` (Anthropic Messages, see :mod:`.messages`), ``GET /v1/models``,
    ``GET /health``, ``GET /metrics`` (Prometheus), ``POST /reset_prefix_cache`` (admin),
    ``GET /v1/cache/pins`` and ``DELETE /v1/cache/pins/{prefix_hash}`` (the caller's pins,
    :mod:`.pins_routes`), ``GET /v1/cache/info`` (served names, model fingerprint, block
    size, KV dtype, hash seed: :mod:`.cache_info`), ``GET`` and ``DELETE
    /v1/sessions/{session_id}`` (the caller's agent sessions, :mod:`.sessions`).

Routes and exception handlers are module-level functions; what they share is
``request.app.state.server``, built once by :func:`create_app`.

Every error is an OpenAI error object (see :mod:`prefixcache.http.errors`; the app and its
error handlers come from :mod:`prefixcache.http.app`): invalid JSON, wrong types,
missing fields and invalid values get 400 naming the field (FastAPI's 422 is never
used), a missing or unknown API key 401, a non-admin caller of an admin endpoint 403,
an unknown model 404 (``code: model_not_found``), an unknown route 404, a body over the
size limit 413, a full waiting queue 429 with ``Retry-After``, a server that is shutting
down 503 (``code: server_shutting_down``). Without a key file, the cross-site checks of
:mod:`.crosssite` add 415 (not JSON), 403 (foreign ``Origin`` on an admin endpoint) and
421 (``Host`` not allowed). A client that disconnects while its body is read gets no
answer and is not counted as an error.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from prefixcache.http.app import create_app as create_http_app
from prefixcache.http.app import error_response as _error_response
from prefixcache.http.app import metrics_response
from prefixcache.http.auth import Authenticator, Principal
from prefixcache.http.drain import DEFAULT_GRACE_S, Drain
from prefixcache.http.errors import SERVER_ERROR, APIError, error_body
from prefixcache.server.async_engine import AsyncEngine
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES, parse_json, read_body
from prefixcache.server.cache_info import ROUTES as INFO_ROUTES
from prefixcache.server.crosssite import HostGuard, check_origin, require_json
from prefixcache.server.messages import error_response, serve_messages
from prefixcache.server.metrics import ServerMetrics
from prefixcache.server.pins_routes import ROUTES as PIN_ROUTES
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from prefixcache.server.serving import OpenAIServing
from prefixcache.server.sessions import ROUTES as SESSION_ROUTES
from prefixcache.server.tools import choose_parser
from prefixcache.text.tool_parsers.registry import detect_parser

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServerSettings", "create_app"]


@dataclass
class ServerSettings:
    """What the app needs besides the engine.

    Attributes:
        model_names: names accepted as ``model`` and listed by ``/v1/models`` (the first
            is reported).
        model_root: the model argument (``/v1/models`` ``root``); accepted as ``model``
            too, not listed.
        auth: API keys and tenants (default: single tenant, no reset).
        max_body_bytes: largest request body accepted (413 beyond).
        stats_timeout_s: how long ``/metrics`` waits for the engine thread before it
            answers with the previous engine snapshot.
        allowed_hosts: ``Host`` names answered (421 for others); ``None``: any.
        shutdown_grace_s: how long running requests may continue after SIGTERM, seconds.
        warmup: run one full-size step on the engine thread before the server accepts
            connections (``LLMEngine.warmup``), so the first request does not pay for
            that thread's memory and the kernels' set-up.
        tool_call_parser: the tool-call parser's name (``--tool-call-parser``);
            ``None``: from the chat template (:func:`.tools.choose_parser`).
    """

    model_names: list[str]
    model_root: str = ""
    auth: Authenticator = field(default_factory=Authenticator)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    stats_timeout_s: float = 10.0
    allowed_hosts: list[str] | None = None
    shutdown_grace_s: float = DEFAULT_GRACE_S
    warmup: bool = True
    tool_call_parser: str | None = None


@dataclass
class _Server:
    """Everything the routes read, as ``request.app.state.server``."""

    settings: ServerSettings
    engine: AsyncEngine
    serving: OpenAIServing
    metrics: ServerMetrics
    drain: Drain
    parse_pool: ThreadPoolExecutor      # large bodies are parsed here (see .bodies)
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def cross_site_checks(self) -> bool:
        return not self.settings.auth.enabled


def create_app(engine: Any, settings: ServerSettings) -> FastAPI:
    """Build the app around an ``LLMEngine``. The engine thread starts with the app's
    lifespan and stops with it."""
    metrics = ServerMetrics(settings.auth.tenants if settings.auth.enabled else None)
    aengine = AsyncEngine(engine, on_output=metrics.observe_output, on_step=metrics.observe_step,
                          warmup=settings.warmup)
    drain = Drain(settings.shutdown_grace_s)
    accepted = settings.model_names + [settings.model_root] * (
        bool(settings.model_root) and settings.model_root not in settings.model_names)
    template = getattr(engine.tokenizer, "chat_template", None)
    parser = choose_parser(settings.tool_call_parser, template)
    log.info("tool calls: %s parser (%s)", parser,
             "--tool-call-parser" if settings.tool_call_parser
             else "the chat template's syntax" if detect_parser(template)
             else "the Hermes fallback: the template has no tool syntax we know")
    serving = OpenAIServing(aengine, tokenizer=engine.tokenizer, model_names=accepted,
                            validate=engine.validate, drain=drain, tool_parser=parser,
                            max_prompts_queued=getattr(getattr(engine, "config", None),
                                                       "max_waiting_requests", None))
    server = _Server(settings, aengine, serving, metrics, drain,
                     ThreadPoolExecutor(1, thread_name_prefix="prefixcache-parse"),
                     engine.max_model_len)
    app = create_http_app("prefixcache", lifespan=_lifespan, drain=drain,
                          on_error=metrics.reject, refuse_when_draining=False)
    app.state.server = server
    app.state.engine = aengine
    app.state.metrics = metrics
    app.state.settings = settings
    if settings.allowed_hosts is not None:
        app.add_middleware(HostGuard, allowed=settings.allowed_hosts, on_reject=metrics.reject)
    for method, path, route in _ROUTES:
        app.add_api_route(path, route, methods=[method])
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    server: _Server = app.state.server
    server.drain.bind(asyncio.get_running_loop())
    server.engine.start()
    await asyncio.to_thread(server.engine.wait_warm)  # before the port opens
    try:
        yield
    finally:
        await asyncio.to_thread(server.engine.shutdown)
        server.parse_pool.shutdown(wait=False)


def _server(request: Request) -> _Server:
    return request.app.state.server


def _principal(request: Request) -> Principal:
    return _server(request).settings.auth.authenticate(request.headers.get("authorization"))


async def _json_body(request: Request, model: type) -> Any:
    server = _server(request)
    if server.cross_site_checks:
        require_json(request)
    raw = await read_body(request, server.settings.max_body_bytes)
    return await parse_json(model, raw, server.parse_pool)


# -- routes --------------------------------------------------------------------------------
async def health(request: Request) -> Response:
    server = _server(request)
    if not server.engine.is_alive():
        return _error_response(request, 503, error_body(
            "the engine thread is not running", type=SERVER_ERROR, code="engine_unavailable"))
    if server.drain.draining:
        return _error_response(request, 503, error_body(
            "the server is shutting down", type=SERVER_ERROR, code="server_shutting_down"))
    shared = getattr(server.engine.engine, "shared", None)
    if shared is not None:  # the shared KV tier degrades hit rate, never availability
        return JSONResponse({"status": "ok",
                             "kv_store": "degraded" if shared.remote.degraded else "ok"})
    return JSONResponse({"status": "ok"})


async def models(request: Request) -> JSONResponse:
    _principal(request)
    server = _server(request)
    s = server.settings
    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "created": server.created, "owned_by": "prefixcache",
         "root": s.model_root or name, "parent": None, "max_model_len": server.max_model_len}
        for name in s.model_names]})


async def completions(request: Request) -> Response:
    arrival = time.perf_counter()
    principal = _principal(request)
    req = await _json_body(request, CompletionRequest)
    return await _server(request).serving.completions(req, principal, request, arrival)


async def chat_completions(request: Request) -> Response:
    arrival = time.perf_counter()
    principal = _principal(request)
    req = await _json_body(request, ChatCompletionRequest)
    return await _server(request).serving.chat(req, principal, request, arrival)


async def messages(request: Request) -> Response:
    arrival = time.perf_counter()
    server = _server(request)
    try:
        principal = _principal(request)
        if server.cross_site_checks:
            require_json(request)
        raw = await read_body(request, server.settings.max_body_bytes)
    except APIError as exc:
        server.metrics.reject(exc.status)
        return error_response(exc)
    response = await serve_messages(server.serving, raw, principal, request, arrival)
    if response.status_code >= 400 and response.status_code != 499:
        server.metrics.reject(response.status_code)
    return response


async def prometheus_metrics(request: Request) -> Response:
    server = _server(request)
    stats = None
    if server.engine.is_alive():
        try:
            stats = await server.engine.call(
                lambda e: e.stats() | _tenant_pages(e, server.settings.auth.tenants),
                timeout=server.settings.stats_timeout_s)
        except Exception:  # an old snapshot beats no answer
            log.warning("engine stats unavailable; serving the previous snapshot")
    return metrics_response(server.metrics.render(stats))


def _tenant_pages(engine: Any, tenants: list[str]) -> dict:
    """Per-tenant pages and quotas for /metrics (engines without them: none)."""
    fn = getattr(engine, "tenant_pages", None)
    return {"tenant_pages": fn(tenants)} if fn is not None and tenants else {}


async def reset_prefix_cache(request: Request) -> JSONResponse:
    server = _server(request)
    principal = _principal(request)
    server.settings.auth.require_admin(principal)
    if server.cross_site_checks:
        check_origin(request, server.settings.allowed_hosts)
    report = await server.engine.call(lambda e: e.reset_prefix_cache())
    log.info("prefix cache reset by tenant %s: dropped %d pages, kept %d in use",
             principal.tenant, report.dropped_pages, report.kept_in_use_pages)
    return JSONResponse({"status": "ok", "dropped_pages": report.dropped_pages,
                         "kept_in_use_pages": report.kept_in_use_pages})


_ROUTES = (("GET", "/health", health), ("GET", "/v1/models", models),
           ("POST", "/v1/completions", completions),
           ("POST", "/v1/chat/completions", chat_completions),
           ("POST", "/v1/messages", messages),
           ("GET", "/metrics", prometheus_metrics),
           ("POST", "/reset_prefix_cache", reset_prefix_cache)) + PIN_ROUTES + INFO_ROUTES + (
    SESSION_ROUTES)
