"""``GET /v1/cache/pins`` and ``DELETE /v1/cache/pins/{prefix_hash}``: a tenant's pins.

A pin is made by a completion with the ``cache_ttl`` extension (``max_tokens: 0``
pre-stores a prefix without generating); see ``prefixcache/cache/pins.py``. The tenant
comes from the API key (``http/auth.py``), never from the request, and a tenant only
ever sees or removes its own pins: another tenant's hash answers 404 exactly like an
unknown one, so nothing reveals that it exists. ``DELETE /v1/cache/pins`` or
``/v1/cache/pins/`` (no hash) is a 400 naming ``prefix_hash``, not a redirect.
"""
from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse

from prefixcache.http.auth import Principal
from prefixcache.http.errors import APIError, bad_request
from prefixcache.sampling_params import ParamError
from prefixcache.server.crosssite import check_origin


def _principal(request: Request) -> Principal:
    return request.app.state.settings.auth.authenticate(request.headers.get("authorization"))


async def list_pins(request: Request) -> JSONResponse:
    """``{"object": "list", "data": [{"prefix_hash", "tokens", "tier", "expires_at",
    "ttl_s"}, ...]}``, the caller's live pins, oldest first (``expires_at`` in Unix
    seconds)."""
    tenant = _principal(request).tenant
    pins = await request.app.state.engine.call(lambda e: e.list_pins(tenant))
    return JSONResponse({"object": "list", "data": [{"object": "cache.pin", **p}
                                                    for p in pins]})


async def delete_pin(request: Request) -> JSONResponse:
    """Unpin one of the caller's prefixes. 404 (``code: pin_not_found``) if the caller
    has no pin by that hash; 400 if it is not a hex string."""
    tenant = _principal(request).tenant
    settings = request.app.state.settings
    if not settings.auth.enabled:
        check_origin(request, settings.allowed_hosts)
    prefix_hash = request.path_params["prefix_hash"]
    try:
        removed = await request.app.state.engine.call(lambda e: e.unpin(prefix_hash, tenant))
    except ParamError as exc:
        raise bad_request(str(exc), "prefix_hash") from None
    if not removed:
        raise APIError(404, f"no pin with prefix_hash {prefix_hash[:64]!r}",
                       param="prefix_hash", code="pin_not_found")
    return JSONResponse({"object": "cache.pin.deleted", "prefix_hash": prefix_hash,
                         "deleted": True})


async def delete_without_hash(request: Request) -> JSONResponse:
    """``DELETE /v1/cache/pins[/]``: 400, the path names no pin (without this route the
    router would answer a redirect or 405)."""
    _principal(request)  # an unauthenticated caller still gets 401 first
    raise bad_request("prefix_hash is required: DELETE /v1/cache/pins/{prefix_hash}",
                      "prefix_hash")


ROUTES = (("GET", "/v1/cache/pins", list_pins),
          ("DELETE", "/v1/cache/pins", delete_without_hash),
          ("DELETE", "/v1/cache/pins/", delete_without_hash),
          ("DELETE", "/v1/cache/pins/{prefix_hash}", delete_pin))
