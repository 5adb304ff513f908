"""The Anthropic Messages event stream, written from text deltas and a final answer.

``message_start`` and the text block's ``content_block_start`` (:func:`stream_start`),
one ``content_block_delta`` per text delta (:func:`stream_delta`), then
:func:`stream_stop`: the text block's stop, a ``tool_use`` block per tool call,
``message_delta`` (stop reason, usage) and ``message_stop``; or an ``error`` event.
A stream whose tool calls arrive as they are generated uses :func:`block_stop`,
:func:`tool_use_start`, :func:`input_json_delta` and :func:`stream_end` instead.
"""
from __future__ import annotations

import json

from prefixcache.server.anthropic_wire import (
    FINISH_TO_STOP,
    error_body,
    message_response,
    tool_use_blocks,
)


def sse_event(event: str, data: dict) -> str:
    """One Messages server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def stream_start(msg_id: str, model: str, usage: dict) -> str:
    """``message_start`` and the text block's ``content_block_start``."""
    msg = {**message_response(msg_id, model, "", None, usage), "content": [],
           "stop_reason": None}
    return (sse_event("message_start", {"type": "message_start", "message": msg})
            + sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}}))


def stream_delta(text: str, index: int = 0) -> str:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "text_delta", "text": text}})


def text_start(index: int) -> str:
    """A further text block's ``content_block_start`` (text after a tool call)."""
    return sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "text", "text": ""}})


def stream_stop(finish_reason: str | None, usage: dict,
                tool_calls: list[dict] | None = None) -> str:
    """``content_block_stop``, one ``tool_use`` block per call (start, its input as one
    ``input_json_delta``, stop), ``message_delta`` (stop reason, usage), ``message_stop``."""
    out = sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
    for i, block in enumerate(tool_use_blocks(tool_calls or []), 1):
        out += sse_event("content_block_start", {"type": "content_block_start", "index": i,
                                                 "content_block": {**block, "input": {}}})
        out += sse_event("content_block_delta", {"type": "content_block_delta", "index": i,
                                                 "delta": {"type": "input_json_delta",
                                                           "partial_json": json.dumps(
                                                               block["input"])}})
        out += sse_event("content_block_stop", {"type": "content_block_stop", "index": i})
    return out + stream_end(finish_reason, usage)


def block_stop(index: int) -> str:
    return sse_event("content_block_stop", {"type": "content_block_stop", "index": index})


def tool_use_start(index: int, block_id: str, name: str) -> str:
    """A streamed ``tool_use`` block's ``content_block_start`` (its input follows as
    :func:`input_json_delta` events)."""
    return sse_event("content_block_start", {"type": "content_block_start", "index": index,
                                             "content_block": {"type": "tool_use",
                                                               "id": block_id, "name": name,
                                                               "input": {}}})


def input_json_delta(index: int, partial_json: str) -> str:
    return sse_event("content_block_delta", {"type": "content_block_delta", "index": index,
                                             "delta": {"type": "input_json_delta",
                                                       "partial_json": partial_json}})


def stream_end(finish_reason: str | None, usage: dict,
               diagnostics: dict | None = None) -> str:
    """``message_delta`` (stop reason, usage; the cache ``diagnostics`` object when the
    request asked for them) and ``message_stop``."""
    extra = {} if diagnostics is None else {"diagnostics": diagnostics}
    return (sse_event("message_delta", {"type": "message_delta", "delta": {
                "stop_reason": FINISH_TO_STOP.get(finish_reason or "stop", "end_turn"),
                "stop_sequence": None}, "usage": usage, **extra})
            + sse_event("message_stop", {"type": "message_stop"}))


def stream_error(message: str, type: str = "api_error") -> str:
    return sse_event("error", error_body(message, type))
