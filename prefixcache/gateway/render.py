"""Answers in the client's wire format: ``chat`` (Chat Completions), ``completions`` or
``messages`` (Anthropic), as one JSON body or server-sent events.

Usage is rebuilt from the normalised counters in the client's format, plus
``usage.cache_layer``: ``exact`` / ``semantic`` (served by the gateway: the counts are
those of the stored answer, and no upstream tokens were spent), ``miss`` or ``bypass``
(forwarded). Tool calls are ``message.tool_calls`` (one delta before the finish chunk
when streaming) or Messages ``tool_use`` blocks. Errors are OpenAI error objects, or
Anthropic ones for ``messages``.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from prefixcache.gateway.accounting import NormalUsage
from prefixcache.gateway.completion import Completion, UpstreamError
from prefixcache.http.errors import error_object
from prefixcache.server import anthropic_sse as sse
from prefixcache.server import anthropic_wire as wire

log = logging.getLogger(__name__)


def usage_for(client: str, u: NormalUsage, layer: str) -> dict:
    if client == "messages":
        out = wire.anthropic_usage(u.prompt, u.cache_read, u.output, u.write_5m + u.write_1h,
                                   "1h" if u.write_1h else "5m")
        if u.write_1h and u.write_5m:
            out["cache_creation"] = {"ephemeral_5m_input_tokens": u.write_5m,
                                     "ephemeral_1h_input_tokens": u.write_1h}
    else:
        out = {"prompt_tokens": u.prompt, "completion_tokens": u.output,
               "total_tokens": u.prompt + u.output,
               "prompt_tokens_details": {"cached_tokens": u.cache_read}}
    out["cache_layer"] = layer
    return out


def _ids(client: str) -> str:
    prefix = {"chat": "chatcmpl", "completions": "cmpl", "messages": "msg"}[client]
    return f"{prefix}-{uuid.uuid4().hex}" if client != "messages" else f"msg_{uuid.uuid4().hex}"


def render_json(client: str, comp: Completion, u: NormalUsage, layer: str, model: str) -> dict:
    usage = usage_for(client, u, layer)
    if client == "messages":
        return wire.message_response(_ids(client), model, comp.text, comp.finish_reason, usage,
                                     comp.tool_calls)
    head = {"id": _ids(client), "created": int(time.time()), "model": model}
    if client == "chat":
        message: dict = {"role": "assistant",
                         "content": comp.text if comp.text or not comp.tool_calls else None}
        if comp.tool_calls:
            message["tool_calls"] = comp.tool_calls
        return {**head, "object": "chat.completion", "choices": [{
            "index": 0, "message": message, "logprobs": None,
            "finish_reason": comp.finish_reason}], "usage": usage}
    return {**head, "object": "text_completion", "choices": [{
        "index": 0, "text": comp.text, "logprobs": None,
        "finish_reason": comp.finish_reason}], "usage": usage}


def error_json(client: str, status: int, message: str, code: str | None,
               param: str | None = None) -> dict:
    """The error object in ``client``'s format (the HTTP foundation's)."""
    return error_object(status, message, anthropic=client == "messages", param=param,
                        code=code)


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'), ensure_ascii=False)}\n\n"


async def render_stream(client: str, items: AsyncIterator[str | Completion], model: str,
                        usage_of: dict) -> AsyncIterator[str]:
    """SSE text for ``items`` (text deltas, then the final Completion). ``usage_of`` is
    filled by the caller's pipeline: ``{"usage": NormalUsage, "layer": str}`` once the
    Completion is known. An UpstreamError, or any other exception (a bug, logged), ends
    the stream with an error event."""
    rid, created = _ids(client), int(time.time())
    obj = "chat.completion.chunk" if client == "chat" else "text_completion"
    head = {"id": rid, "object": obj, "created": created, "model": model}
    if client == "messages":
        yield sse.stream_start(rid, model, wire.anthropic_usage(0, 0, 0))
    elif client == "chat":
        yield _sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant",
                                                              "content": ""},
                                        "finish_reason": None}]})
    try:
        async for item in items:
            if isinstance(item, str):
                if client == "messages":
                    yield sse.stream_delta(item)
                elif client == "chat":
                    yield _sse({**head, "choices": [{"index": 0, "delta": {"content": item},
                                                    "finish_reason": None}]})
                else:
                    yield _sse({**head, "choices": [{"index": 0, "text": item,
                                                    "finish_reason": None}]})
                continue
            usage = usage_for(client, usage_of["usage"], usage_of["layer"])
            if client == "messages":
                yield sse.stream_stop(item.finish_reason, usage, item.tool_calls)
                return
            if client == "chat" and item.tool_calls:
                calls = [{"index": i, **c} for i, c in enumerate(item.tool_calls)]
                yield _sse({**head, "choices": [{"index": 0, "delta": {"tool_calls": calls},
                                                "finish_reason": None}]})
            delta: dict = {"delta": {}} if client == "chat" else {"text": ""}
            yield _sse({**head, "choices": [{"index": 0, **delta,
                                            "finish_reason": item.finish_reason}]})
            yield _sse({**head, "choices": [], "usage": usage})
            yield "data: [DONE]\n\n"
            return
    except Exception as exc:  # an UpstreamError, or a bug (logged): an error event
        if not isinstance(exc, UpstreamError):
            log.exception("the gateway failed while streaming")
            exc = UpstreamError(500, "the gateway failed on this request (see its log)",
                                "internal_error")
        if client == "messages":
            yield sse.stream_error(exc.message)
        else:
            yield _sse(error_json(client, exc.status, exc.message, exc.code))
            yield "data: [DONE]\n\n"
