"""Cross-site request defences of a server without API keys.

Without a key file anyone who can reach the port may use the API, and so may a web page
in the user's browser: a ``<form>`` can POST ``text/plain`` to ``127.0.0.1``, and DNS
rebinding makes ``evil.example`` resolve to it. Three checks close that:

* :func:`require_json`: JSON endpoints need ``Content-Type: application/json`` (415
  otherwise); a browser sends that type cross-site only after a CORS preflight, which
  this server never grants.
* :func:`check_origin`: state-changing admin endpoints refuse a request whose
  ``Origin`` is not one of the allowed hosts (403).
* :class:`HostGuard`: a ``Host`` header that is not an allowed host gets 421, which
  defeats DNS rebinding (the browser sends the attacker's host name).

With a key file the browser cannot send a key it does not know, so the server applies
them only without one (or when ``--allowed-hosts`` is given explicitly).
"""
from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request

from prefixcache.http.errors import PERMISSION, APIError, error_body

WILDCARD_BINDS = ("0.0.0.0", "::", "")


def default_allowed_hosts(bind_host: str) -> list[str] | None:
    """The hosts a server bound to ``bind_host`` answers by default: that host and
    loopback names; ``None`` (any host) when it is bound to every address."""
    if bind_host in WILDCARD_BINDS:
        return None
    return sorted({bind_host.lower().strip("[]"), "localhost", "127.0.0.1", "::1"})


def host_name(value: str) -> str:
    """``'Example.COM:8000'`` -> ``'example.com'``; ``'[::1]:80'`` -> ``'::1'``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def is_json_type(content_type: str | None) -> bool:
    media = (content_type or "").partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                           and media.endswith("+json"))


def require_json(request: Request) -> None:
    """Raises APIError 415 unless the request declares a JSON body."""
    if not is_json_type(request.headers.get("content-type")):
        raise APIError(415, "the request body must be sent with 'Content-Type: "
                       "application/json'", code="unsupported_media_type")


def check_origin(request: Request, allowed: list[str] | None) -> None:
    """Raises APIError 403 when the request carries an ``Origin`` whose host is not
    allowed (``allowed`` ``None``: the host must equal the ``Host`` header's)."""
    origin = request.headers.get("origin")
    if origin is None:
        return
    name = host_name(urlsplit(origin).netloc) if origin != "null" else ""
    ok = allowed or [host_name(request.headers.get("host", ""))]
    if not name or name not in ok:
        raise APIError(403, "cross-origin requests may not call admin endpoints",
                       type=PERMISSION, code="cross_origin")


Send = Callable[[dict], Awaitable[None]]


class HostGuard:
    """ASGI middleware: HTTP requests whose ``Host`` is not in ``allowed`` get 421 with
    an OpenAI error object; ``on_reject(421)`` is called for each (metrics)."""

    def __init__(self, app: Any, allowed: list[str], on_reject: Callable[[int], None]):
        self.app = app
        self.allowed = {host_name(h) for h in allowed}
        self.on_reject = on_reject

    async def __call__(self, scope: dict, receive: Any, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if host_name(host) not in self.allowed:
                self.on_reject(421)
                body = json.dumps(error_body(
                    "this server does not answer for the Host in the request (see "
                    "--allowed-hosts)", code="misdirected_request")).encode()
                await send({"type": "http.response.start", "status": 421,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)
