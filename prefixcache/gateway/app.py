"""The gateway's FastAPI app.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (OpenAI),
``POST /v1/messages`` (Anthropic), streaming or not; ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus), ``GET /v1/gateway/stats`` (per-tenant JSON).

Authentication uses the server's key file format (:mod:`prefixcache.http.auth`); the
tenant comes from the key, never from the body, and no answer or header carries a key.
Each answer says which layer served it: header ``x-prefixcache-cache`` (``exact``,
``semantic``, ``miss``, ``bypass``) and ``usage.cache_layer``.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.gateway.completion import UpstreamError
from prefixcache.gateway.render import error_json, render_json, render_stream
from prefixcache.gateway.requests import BadRequest
from prefixcache.gateway.service import Gateway, Outcome, replay
from prefixcache.gateway.validate import parse
from prefixcache.http.app import create_app as create_http_app
from prefixcache.http.app import metrics_response, shutting_down
from prefixcache.http.auth import Authenticator, Principal
from prefixcache.http.bodies import DEFAULT_MAX_BODY_BYTES, read_body
from prefixcache.http.drain import DEFAULT_GRACE_S, Drain
from prefixcache.http.errors import APIError

LAYER_HEADER = "x-prefixcache-cache"
log = logging.getLogger(__name__)


def create_app(gateway: Gateway, auth: Authenticator | None = None,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               shutdown_grace_s: float = DEFAULT_GRACE_S) -> FastAPI:
    """The app around ``gateway`` (on :mod:`prefixcache.http`'s foundation); its upstream
    HTTP clients close with the app. ``shutdown_grace_s``: how long running requests may
    continue after SIGTERM, seconds."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.drain.bind(asyncio.get_running_loop())
        yield
        for u in gateway.upstreams:
            await u.client.aclose()
        await gateway.store.close()

    app = create_http_app("prefixcache gateway", lifespan=lifespan,
                          drain=Drain(shutdown_grace_s))
    app.state.gateway = gateway
    app.state.auth = auth or Authenticator()
    app.state.max_body_bytes = max_body_bytes
    for path, client in (("/v1/chat/completions", "chat"), ("/v1/completions", "completions"),
                         ("/v1/messages", "messages")):
        app.add_api_route(path, _endpoint(client), methods=["POST"])
    app.add_api_route("/v1/models", models, methods=["GET"])
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    app.add_api_route("/v1/gateway/stats", stats, methods=["GET"])
    return app


def _principal(request: Request) -> Principal:
    return request.app.state.auth.authenticate(request.headers.get("authorization"))


def _error(client: str, status: int, message: str, code: str | None,
           param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_json(client, status, message, code, param), status_code=status,
                        headers=headers)


def _endpoint(client: str):
    async def route(request: Request) -> Response:
        try:
            return await _serve(client, request)
        except Exception:  # a bug: a JSON 500 in the client's format, never plain text
            log.exception("the gateway failed on %s %s", request.method, request.url.path)
            return _error(client, 500, "the gateway failed on this request (see its log)",
                          "internal_error")

    return route


async def _serve(client: str, request: Request) -> Response:
    """One request, from authentication to the answer (BadRequest / UpstreamError:
    an error in the client's format)."""
    gateway: Gateway = request.app.state.gateway
    try:
        principal = _principal(request)
        raw = await read_body(request, request.app.state.max_body_bytes)
    except APIError as exc:
        return _error(client, exc.status, exc.message, exc.code, exc.param, exc.headers)
    try:
        body = parse(raw)
        outcome = await gateway.handle(principal.tenant, client, body)
    except BadRequest as exc:
        return _error(client, exc.status, exc.message, exc.code, exc.param)
    except UpstreamError as exc:
        return _error(client, exc.status, exc.message, exc.code)
    return _respond(client, outcome, str(body.get("model")), bool(body.get("stream")))


def _respond(client: str, outcome: Outcome, model: str, stream: bool) -> Response:
    headers = {LAYER_HEADER: outcome.layer}
    if not stream:
        assert outcome.completion is not None and outcome.usage is not None
        return JSONResponse(render_json(client, outcome.completion, outcome.usage,
                                        outcome.layer, model), headers=headers)
    items = outcome.stream
    if items is None:
        assert outcome.completion is not None
        items = replay(outcome.completion, outcome)
    return _ClosingStream(render_stream(client, items, model, outcome.final), outcome.close,
                          media_type="text/event-stream",
                          headers={**headers, "Cache-Control": "no-cache"})


class _ClosingStream(StreamingResponse):
    """Runs ``on_close`` however the response ends (even when it never started), so a
    forwarded stream always releases its upstream connection and single-flight slot."""

    def __init__(self, content: Any, on_close: Any, **kw: Any):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._on_close is not None:
                await self._on_close()


async def models(request: Request) -> Response:
    try:
        _principal(request)
    except APIError as exc:
        return _error("chat", exc.status, exc.message, exc.code, headers=exc.headers)
    gateway: Gateway = request.app.state.gateway
    names = [m for u in gateway.upstreams for m in u.spec.models]
    return JSONResponse({"object": "list", "data": [
        {"id": m, "object": "model", "owned_by": "prefixcache-gateway"} for m in names]})


async def health(request: Request) -> Response:
    if request.app.state.drain.draining:
        return shutting_down(request)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    return metrics_response(request.app.state.gateway.metrics.render())


async def stats(request: Request) -> Response:
    try:
        p = _principal(request)
    except APIError as exc:
        return _error("chat", exc.status, exc.message, exc.code, headers=exc.headers)
    return JSONResponse(request.app.state.gateway.metrics.stats(p.tenant, p.admin))


def make_client(transport: Any = None) -> httpx.AsyncClient:
    """The upstreams' HTTP client (``transport``: tests pass an ASGI transport)."""
    return httpx.AsyncClient(transport=transport, limits=httpx.Limits(max_connections=256))
