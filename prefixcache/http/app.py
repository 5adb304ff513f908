"""The FastAPI app every front end builds its routes on.

:func:`create_app` gives an app whose every error is an error object: an
:class:`~prefixcache.http.errors.APIError` answers its status and body, FastAPI's
validation errors answer 400 naming the field (never 422), an unknown route 404, a wrong
method 405, an unhandled exception a 500 ``server_error`` (logged with its traceback), and a
client that disconnects while sending its body is answered nothing and not counted.
``on_error(status)`` is told of every error answered (the apps count them in ``/metrics``).

Every app counts its HTTP requests in flight (``drain.in_flight``, logged when SIGTERM
starts the drain). With ``refuse_when_draining``, once the app's
:class:`~prefixcache.http.drain.Drain` has begun, a new request other than ``GET`` gets
503 ``server_shutting_down`` (requests already running finish). Apps that manage
admission themselves (the server refuses in its serving layer) leave it off.

Errors on ``/v1/messages`` paths are Anthropic-style, the others OpenAI-style.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from prefixcache.http.drain import Drain
from prefixcache.http.errors import SERVER_ERROR, APIError
from prefixcache.http.errors import error_object as http_error_object
from prefixcache.http.logsafe import clean

log = logging.getLogger(__name__)


def create_app(title: str, *, lifespan: Any, drain: Drain,
               on_error: Callable[[int], None] | None = None,
               refuse_when_draining: bool = True) -> FastAPI:
    """A FastAPI app with the foundation's error handlers; ``app.state.drain`` is
    ``drain``. Add the routes with ``app.add_api_route``."""
    app = FastAPI(title=title, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.drain = drain
    app.state.on_error = on_error
    app.add_middleware(_Admission, drain=drain, on_error=on_error,
                       refuse_when_draining=refuse_when_draining)
    for exc_type, handler in _HANDLERS:
        app.add_exception_handler(exc_type, handler)
    return app


def error_response(request: Request, status: int, body: dict,
                   headers: dict | None = None) -> JSONResponse:
    """``body`` with ``status``, counted by the app's ``on_error``."""
    on_error = getattr(request.app.state, "on_error", None)
    if on_error is not None:
        on_error(status)
    return JSONResponse(body, status_code=status, headers=headers)


def error_object(path: str, status: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None) -> dict:
    """The error body for a request to ``path``: Anthropic-style on ``/v1/messages``,
    else OpenAI's (:func:`prefixcache.http.errors.error_object`)."""
    return http_error_object(status, message, anthropic=path.rstrip("/").endswith(
        "/v1/messages"), type=type, param=param, code=code)


def metrics_response(text: str | bytes) -> Response:
    """A Prometheus exposition (``GET /metrics``)."""
    return Response(text, media_type=CONTENT_TYPE_LATEST)


def shutting_down(request: Request) -> JSONResponse:
    """503 ``server_shutting_down`` (``/health`` and new requests while draining)."""
    return error_response(request, 503, error_object(
        request.url.path, 503, "the server is shutting down", type=SERVER_ERROR,
        code="server_shutting_down"))


class _Admission:
    """Counts the HTTP requests in flight (``drain.in_flight``, logged when the drain
    begins); with ``refuse_when_draining``, new non-GET requests get 503 once it has."""

    def __init__(self, app: ASGIApp, drain: Drain, on_error: Callable[[int], None] | None,
                 refuse_when_draining: bool):
        self.app = app
        self.drain = drain
        self.on_error = on_error
        self.refuse = refuse_when_draining

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.refuse and self.drain.draining and scope["method"] != "GET":
            if self.on_error is not None:
                self.on_error(503)
            body = error_object(scope["path"], 503, "the server is shutting down; retry on "
                                "another server", type=SERVER_ERROR, code="server_shutting_down")
            await JSONResponse(body, status_code=503)(scope, receive, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    body = (exc.body() if not request.url.path.rstrip("/").endswith("/v1/messages")
            else error_object(request.url.path, exc.status, exc.message, param=exc.param))
    return error_response(request, exc.status, body, exc.headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    # Nobody reads this answer, and it is no error of the server's: not counted.
    log.debug("client disconnected while sending %s %s", request.method,
              clean(request.url.path))
    return Response(status_code=499)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    msg = {404: f"no route {request.method} {clean(request.url.path)}",
           405: f"method {request.method} is not allowed on {clean(request.url.path)}"
           }.get(exc.status_code, str(exc.detail))
    return error_response(request, exc.status_code, error_object(
        request.url.path, exc.status_code, msg, code=str(exc.status_code)),
        getattr(exc, "headers", None))


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errs = exc.errors()
    param = ".".join(str(p) for p in errs[0]["loc"][1:]) if errs else None
    return error_response(request, 400, error_object(
        request.url.path, 400, str(errs[0]["msg"]) if errs else "invalid request",
        param=param or None))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, clean(request.url.path))
    return error_response(request, 500, error_object(
        request.url.path, 500, f"internal server error: {type(exc).__name__}",
        type=SERVER_ERROR))


_HANDLERS = ((APIError, _api_error), (ClientDisconnect, _client_gone),
             (StarletteHTTPException, _http_error), (RequestValidationError, _validation_error),
             (Exception, _internal_error))
