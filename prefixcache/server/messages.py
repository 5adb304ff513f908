"""``POST /v1/messages``: the Anthropic Messages API over the chat completions path.

The body is translated to a Chat Completions request (:mod:`.anthropic_wire`), served by
:class:`~.serving.OpenAIServing` like any chat request, and its answer translated back:
one JSON message, or the Messages event stream (``message_start``, sent with the first
engine output so that its usage has the prompt's counts, ``content_block_delta``...,
``message_delta`` with the stop reason and the final usage, ``message_stop``). The body's
shape is checked first (:mod:`.anthropic_check`). Errors are Anthropic error objects
(``{"type": "error", "error": {"type", "message"}}``) with the same HTTP status the
OpenAI routes use; an unexpected exception is a 500 ``api_error``.

``cache_control`` breakpoints map to the engine's TTL pins: the request's
``pin_ttl_s`` is the longest TTL asked for (``"5m"`` 300 s, ``"1h"`` 3600 s). Usage:
``cache_read_input_tokens`` = the engine's ``cached_tokens``; with a breakpoint, the
prompt tokens computed (``prompt - cached``) are reported as
``cache_creation_input_tokens`` (the engine publishes every full page it computes),
without one as ``input_tokens``.
"""
from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from prefixcache.engine.miss_diagnostics import message_anchors
from prefixcache.http.errors import APIError
from prefixcache.server import anthropic_sse as sse
from prefixcache.server import anthropic_wire as wire
from prefixcache.server.anthropic_check import check_body
from prefixcache.server.diagnostics import anthropic_ask, anthropic_diagnostics
from prefixcache.server.protocol import ChatCompletionRequest, parse_body

log = logging.getLogger(__name__)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


def error_response(exc: APIError) -> JSONResponse:
    """An :class:`APIError` as an Anthropic error response (same status and headers)."""
    kind = _ERROR_TYPES.get(exc.status, "api_error")
    return JSONResponse(wire.error_body(exc.message, kind), status_code=exc.status,
                        headers=exc.headers)


def usage_of(openai_usage: dict, ttl_s: float | None) -> dict:
    """Messages usage from an OpenAI usage object of our engine (``ttl_s``: the pin)."""
    prompt = int(openai_usage.get("prompt_tokens", 0))
    cached = int((openai_usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
    written = prompt - cached if ttl_s is not None else 0
    return wire.anthropic_usage(prompt, cached, int(openai_usage.get("completion_tokens", 0)),
                                written, "1h" if (ttl_s or 0) > 300 else "5m")


def translate(raw: bytes) -> tuple[ChatCompletionRequest, float | None, dict]:
    """A Messages body -> (chat request, pin TTL seconds, the body). Raises APIError 400
    (the body's shape is checked first: :mod:`.anthropic_check`)."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        ttl = check_body(body)
        chat = wire.messages_to_chat(body)
    except wire.WireError as exc:  # Anthropic errors have no ``param``: name it in the text
        text = str(exc) if str(exc).startswith(exc.param) else f"{exc.param}: {exc}"
        raise APIError(400, text, param=exc.param) from None
    if isinstance(body.get("cache_salt"), str):  # our extension, as on the OpenAI routes
        chat["cache_salt"] = body["cache_salt"]
    if "session_id" in body:  # an agent session (server/sessions.py), as on OpenAI routes
        chat["session_id"] = body["session_id"]
    if chat.get("stream"):  # usage in every chunk: message_start reports the prompt's
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    req = parse_body(ChatCompletionRequest, json.dumps(chat).encode())
    assert isinstance(req, ChatCompletionRequest)
    return req, ttl, body


async def serve_messages(serving: Any, raw: bytes, principal: Any, request: Request,
                         arrival: float) -> Response:
    """Serve one Messages request through ``serving`` (an ``OpenAIServing``); every
    error, an unexpected one included (500 ``api_error``), is an Anthropic error."""
    try:
        return await _serve(serving, raw, principal, request, arrival)
    except APIError as exc:
        return error_response(exc)
    except ClientDisconnect:
        raise
    except Exception as exc:
        log.exception("unhandled error on POST /v1/messages")
        return error_response(APIError(500, f"internal server error: {type(exc).__name__}"))


async def _serve(serving: Any, raw: bytes, principal: Any, request: Request,
                 arrival: float) -> Response:
    req, ttl, body = translate(raw)
    ask = anthropic_ask(body, {} if request is None else request.headers)
    if ask is not None:
        ask = replace(ask, anchors=message_anchors(body["messages"], body.get("tools"),
                                                   body.get("system")))
    msg_id = f"msg_{uuid.uuid4().hex}"
    resp = await serving.chat(req, principal, request, arrival, pin_ttl_s=ttl,
                              response_id=msg_id, diagnostics=ask)
    model = str(body.get("model") or "")
    if isinstance(resp, StreamingResponse):
        resp.body_iterator = _events(resp.body_iterator, msg_id, model, ttl, ask is not None)
        return resp
    if not isinstance(resp, JSONResponse):
        return resp  # 499: the client is gone
    data = json.loads(bytes(resp.body))
    choice = data["choices"][0]
    calls = [{**c, "id": wire.tool_use_id(c.get("id"))}
             for c in choice["message"].get("tool_calls") or []]
    out = wire.message_response(
        msg_id, model, choice["message"]["content"] or "", choice.get("finish_reason"),
        usage_of(data["usage"], ttl), tool_calls=calls)
    if ask is not None and data.get("prompt_cache_diagnostics"):
        out["diagnostics"] = anthropic_diagnostics(data["prompt_cache_diagnostics"])
    return JSONResponse(out)


async def _events(chunks: AsyncIterable[Any], msg_id: str, model: str, ttl_s: float | None,
                  diagnose: bool = False) -> AsyncIterator[str]:
    """OpenAI chat chunks (SSE text, with usage in every chunk) -> Messages events.

    ``message_start`` waits for the first chunk: its usage has the prompt's counts
    (``input_tokens``, ``cache_read_input_tokens``, ``cache_creation_input_tokens``,
    known once the request is admitted), ``output_tokens`` 0; ``message_delta`` has the
    final usage. Tool calls: the text block (index 0) stops, then each call is a
    ``tool_use`` block (``content_block_start`` with its id and name, its arguments as
    ``input_json_delta`` events); text after a call opens a new text block. A stream
    that fails ends with an ``error`` event. With ``diagnose``, the ``message_delta``
    event carries the cache ``diagnostics`` object (the non-streamed response's)."""
    started = False
    diagnostics = None
    finish: str | None = None
    usage = None
    block, in_tool = 0, False  # the open content block, and whether it is a tool_use
    try:
        async for chunk in chunks:
            text = chunk if isinstance(chunk, str) else bytes(chunk).decode()
            for line in text.split("\n"):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    yield sse.stream_error(obj["error"].get("message", "engine error"))
                    return
                if obj.get("usage"):
                    usage = usage_of(obj["usage"], ttl_s)
                if diagnose and obj.get("prompt_cache_diagnostics"):
                    diagnostics = anthropic_diagnostics(obj["prompt_cache_diagnostics"])
                if not started and usage is not None:
                    started = True
                    yield sse.stream_start(msg_id, model, {**usage, "output_tokens": 0})
                for c in obj.get("choices") or []:
                    delta = c.get("delta") or {}
                    if delta.get("content") and in_tool:  # text after a call: a new block
                        yield sse.block_stop(block)
                        block, in_tool = block + 1, False
                        yield sse.text_start(block)
                    if delta.get("content"):
                        yield sse.stream_delta(delta["content"], block)
                    for call in delta.get("tool_calls") or []:
                        fn = call.get("function") or {}
                        if call.get("id"):
                            yield sse.block_stop(block)
                            block, in_tool = block + 1, True
                            yield sse.tool_use_start(block, str(wire.tool_use_id(call["id"])),
                                                     str(fn.get("name")))
                        if fn.get("arguments"):
                            yield sse.input_json_delta(block, fn["arguments"])
                    finish = c.get("finish_reason") or finish
    except Exception as exc:  # the stream has begun: answer with an error event
        log.exception("Messages stream failed")
        yield sse.stream_error(f"internal server error: {type(exc).__name__}")
        return
    if not started:
        yield sse.stream_start(msg_id, model, usage or wire.anthropic_usage(0, 0, 0))
    yield sse.block_stop(block) + sse.stream_end(
        finish, usage or wire.anthropic_usage(0, 0, 0), diagnostics)
