"""The FastAPI application: routes, authentication, body limits and error mapping.

Routes:
    ``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI, streaming or not),
    ``GET /v1/models``, ``GET /health``, ``GET /metrics`` (Prometheus),
    ``POST /reset_prefix_cache`` (admin).

Every error is an OpenAI error object (see :mod:`.errors`): invalid JSON, wrong types,
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
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from prefixcache.server.async_engine import AsyncEngine
from prefixcache.server.auth import Authenticator, Principal
from prefixcache.server.bodies import DEFAULT_MAX_BODY_BYTES, parse_json, read_body
from prefixcache.server.crosssite import HostGuard, check_origin, require_json
from prefixcache.server.drain import DEFAULT_GRACE_S, Drain
from prefixcache.server.errors import SERVER_ERROR, APIError, error_body
from prefixcache.server.logsafe import clean
from prefixcache.server.metrics import ServerMetrics
from prefixcache.server.protocol import ChatCompletionRequest, CompletionRequest
from prefixcache.server.serving import OpenAIServing

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServerSettings", "create_app"]


@dataclass
class ServerSettings:
    """What the app needs besides the engine.

    Attributes:
        model_names: names accepted as ``model`` (the first is reported).
        model_root: the model argument (``/v1/models`` ``root``).
        auth: API keys and tenants (default: single tenant, no reset).
        max_body_bytes: largest request body accepted (413 beyond).
        stats_timeout_s: how long ``/metrics`` waits for the engine thread before it
            answers with the previous engine snapshot.
        allowed_hosts: ``Host`` names answered (421 for others); ``None``: any.
        shutdown_grace_s: how long running requests may continue after SIGTERM, seconds.
    """

    model_names: list[str]
    model_root: str = ""
    auth: Authenticator = field(default_factory=Authenticator)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    stats_timeout_s: float = 10.0
    allowed_hosts: list[str] | None = None
    shutdown_grace_s: float = DEFAULT_GRACE_S


def create_app(engine: Any, settings: ServerSettings) -> FastAPI:
    """Build the app around an ``LLMEngine``. The engine thread starts with the app's
    lifespan and stops with it."""
    metrics = ServerMetrics(settings.auth.tenants if settings.auth.enabled else None)
    aengine = AsyncEngine(engine, on_output=metrics.observe_output, on_step=metrics.observe_step)
    drain = Drain(settings.shutdown_grace_s)
    serving = OpenAIServing(aengine, tokenizer=engine.tokenizer, model_names=settings.model_names,
                            validate=engine.validate, drain=drain,
                            max_prompts_queued=getattr(getattr(engine, "config", None),
                                                       "max_waiting_requests", None))
    auth = settings.auth
    cross_site_checks = not auth.enabled
    # Large bodies are parsed here, one at a time (see .bodies).
    parse_pool = ThreadPoolExecutor(1, thread_name_prefix="prefixcache-parse")
    created = int(time.time())
    max_model_len = engine.max_model_len

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        drain.bind(asyncio.get_running_loop())
        aengine.start()
        try:
            yield
        finally:
            await asyncio.to_thread(aengine.shutdown)
            parse_pool.shutdown(wait=False)

    app = FastAPI(title="prefixcache", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine = aengine
    app.state.metrics = metrics
    app.state.settings = settings
    app.state.drain = drain
    if settings.allowed_hosts is not None:
        app.add_middleware(HostGuard, allowed=settings.allowed_hosts, on_reject=metrics.reject)

    def principal_of(request: Request) -> Principal:
        return auth.authenticate(request.headers.get("authorization"))

    async def json_body(request: Request, model: type) -> Any:
        if cross_site_checks:
            require_json(request)
        return await parse_json(model, await read_body(request, settings.max_body_bytes),
                                parse_pool)

    # -- error mapping -----------------------------------------------------------------
    def error_response(status: int, body: dict, headers: dict | None = None) -> JSONResponse:
        metrics.reject(status)
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.body(), exc.headers)

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
        # Nobody reads this answer; not an error of the server's.
        log.debug("client disconnected while sending %s %s", request.method,
                  clean(request.url.path))
        return Response(status_code=499)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = {404: f"no route {request.method} {request.url.path}",
               405: f"method {request.method} is not allowed on {request.url.path}"
               }.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, error_body(msg, code=str(exc.status_code)),
                              getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        param = ".".join(str(p) for p in errs[0]["loc"][1:]) if errs else None
        return error_response(400, error_body(str(errs[0]["msg"]) if errs else "invalid request",
                                              param=param or None))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, clean(request.url.path))
        return error_response(500, error_body(f"internal server error: {type(exc).__name__}",
                                              type=SERVER_ERROR))

    # -- routes ------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        if not aengine.is_alive():
            return error_response(503, error_body("the engine thread is not running",
                                                  type=SERVER_ERROR, code="engine_unavailable"))
        if drain.draining:
            return error_response(503, error_body("the server is shutting down",
                                                  type=SERVER_ERROR, code="server_shutting_down"))
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        principal_of(request)
        return JSONResponse({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "prefixcache",
             "root": settings.model_root or name, "parent": None,
             "max_model_len": max_model_len}
            for name in settings.model_names]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        arrival = time.perf_counter()
        principal = principal_of(request)
        req = await json_body(request, CompletionRequest)
        return await serving.completions(req, principal, request, arrival)  # type: ignore[arg-type]

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        arrival = time.perf_counter()
        principal = principal_of(request)
        req = await json_body(request, ChatCompletionRequest)
        return await serving.chat(req, principal, request, arrival)  # type: ignore[arg-type]

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        stats = None
        if aengine.is_alive():
            try:
                stats = await aengine.call(lambda e: e.stats(), timeout=settings.stats_timeout_s)
            except Exception:  # an old snapshot beats no answer
                log.warning("engine stats unavailable; serving the previous snapshot")
        return Response(metrics.render(stats), media_type=CONTENT_TYPE_LATEST)

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        principal = principal_of(request)
        auth.require_admin(principal)
        if cross_site_checks:
            check_origin(request, settings.allowed_hosts)
        report = await aengine.call(lambda e: e.reset_prefix_cache())
        log.info("prefix cache reset by tenant %s: dropped %d pages, kept %d in use",
                 principal.tenant, report.dropped_pages, report.kept_in_use_pages)
        return JSONResponse({"status": "ok", "dropped_pages": report.dropped_pages,
                             "kept_in_use_pages": report.kept_in_use_pages})

    return app
