"""Agent sessions on the HTTP APIs: how a request names its session, and the routes.

A request names its session (``prefixcache/cache/sessions.py``) by, in this order: the
body's ``session_id``, OpenAI's ``prompt_cache_key``, or the header ``X-Session-Id`` (for
clients that cannot add fields), on ``/v1/completions``, ``/v1/chat/completions`` and
``/v1/messages``. The session is the caller's tenant's (from the API key): another
tenant's same id is another session. ``GET /v1/sessions/{session_id}`` shows it,
``DELETE /v1/sessions/{session_id}`` closes it (its kept pages are freed at once); a
session the caller does not have answers 404, exactly like another tenant's.
"""
from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from prefixcache.cache.sessions import check_session_id
from prefixcache.http.errors import APIError, bad_request
from prefixcache.sampling_params import ParamError
from prefixcache.server.crosssite import check_origin
from prefixcache.server.pins_routes import _principal

HEADER = "x-session-id"


def request_session(body_id: Any, cache_key: Any, headers: Any) -> str | None:
    """The session a request names: ``session_id``, else ``prompt_cache_key``, else the
    ``X-Session-Id`` header. Raises APIError 400 naming the field at fault."""
    for value, param in ((body_id, "session_id"), (cache_key, "prompt_cache_key"),
                         (headers.get(HEADER), HEADER)):
        if value is None:
            continue
        try:
            return check_session_id(value, param)
        except ValueError as exc:
            raise bad_request(str(exc), param) from None
    return None


def _session_id(request: Request) -> str:
    sid = request.path_params["session_id"]
    try:
        return check_session_id(sid) or ""
    except ValueError as exc:
        raise bad_request(str(exc), "session_id") from None


async def get_session(request: Request) -> JSONResponse:
    """``{"object": "session", "session_id", "running", "calls", "tokens",
    "expires_at"}`` (``expires_at``: Unix seconds, ``null`` while no transcript is
    kept). 404 (``code: session_not_found``) for no such live session of the caller."""
    tenant = _principal(request).tenant
    sid = _session_id(request)
    info = await request.app.state.engine.call(lambda e: e.session_info(sid, tenant))
    if info is None:
        raise APIError(404, f"no live session {sid[:64]!r}", param="session_id",
                       code="session_not_found")
    return JSONResponse({"object": "session", **info})


async def delete_session(request: Request) -> JSONResponse:
    """Close one of the caller's sessions: its kept transcript is freed at once. 404
    (``code: session_not_found``) if the caller has no such live session."""
    tenant = _principal(request).tenant
    settings = request.app.state.settings
    if not settings.auth.enabled:
        check_origin(request, settings.allowed_hosts)
    sid = _session_id(request)
    try:
        closed = await request.app.state.engine.call(lambda e: e.close_session(sid, tenant))
    except ParamError as exc:
        raise bad_request(str(exc), "session_id") from None
    if not closed:
        raise APIError(404, f"no live session {sid[:64]!r}", param="session_id",
                       code="session_not_found")
    return JSONResponse({"object": "session.deleted", "session_id": sid, "deleted": True})


ROUTES = (("GET", "/v1/sessions/{session_id}", get_session),
          ("DELETE", "/v1/sessions/{session_id}", delete_session))
