"""OpenAI-style error objects and the exception that carries one.

Every error the server, the router and the gateway answer has the body OpenAI's API uses::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
               "code": null}}

``param`` names the offending request field (``null`` when there is none, e.g. a body
that is not JSON).
"""
from __future__ import annotations

from typing import Any

INVALID_REQUEST = "invalid_request_error"
RATE_LIMIT = "rate_limit_error"
SERVER_ERROR = "server_error"
PERMISSION = "permission_error"


class APIError(Exception):
    """An error answer: HTTP ``status`` with an OpenAI error object.

    Args:
        status: HTTP status code.
        message: human-readable message.
        type: OpenAI error ``type``.
        param: the request field at fault, or ``None``.
        code: OpenAI error ``code`` (``model_not_found``, ``invalid_api_key``...).
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, *, type: str = INVALID_REQUEST,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = INVALID_REQUEST, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def anthropic_error_body(message: str, type: str = INVALID_REQUEST) -> dict[str, Any]:
    """An Anthropic-style error object (``/v1/messages`` answers these)."""
    return {"type": "error", "error": {"type": type, "message": message}}


_ANTHROPIC_TYPES = {400: INVALID_REQUEST, 401: "authentication_error", 403: PERMISSION,
                    404: "not_found_error", 413: "request_too_large", 429: RATE_LIMIT,
                    503: "overloaded_error"}


def error_object(status: int, message: str, *, anthropic: bool = False,
                 type: str | None = None, param: str | None = None,
                 code: str | None = None) -> dict[str, Any]:
    """The error body of an answer with HTTP ``status``: OpenAI's (``type`` defaults to
    ``invalid_request_error`` below 500, ``server_error`` from 500), or with
    ``anthropic`` Anthropic's (its ``type`` from the status; ``param``, which it has no
    field for, is prefixed to the message)."""
    if anthropic:
        if param and param not in message:
            message = f"{param}: {message}"
        return anthropic_error_body(message, _ANTHROPIC_TYPES.get(status, "api_error"))
    return error_body(message, type or (INVALID_REQUEST if status < 500 else SERVER_ERROR),
                      param, code)
