"""The Anthropic Messages wire format, translated to and from OpenAI Chat Completions.

Pure functions on JSON-shaped dicts, used by our server's ``POST /v1/messages`` and by
the gateway (which translates in both directions):

================================  ==================================================
Messages                          Chat Completions
================================  ==================================================
``system`` (string or blocks)     a first ``system`` message
``messages[].content`` blocks     text blocks joined (or kept as text parts, see
                                  below); ``tool_use`` -> ``tool_calls``;
                                  ``tool_result`` -> a ``tool`` message
``tools[{name, description,       ``tools[{type: function, function: {name,
input_schema}]``                  description, parameters}}]``
``max_tokens``, ``temperature``,  the same names; ``stop_sequences`` -> ``stop``
``top_p``, ``top_k``
``tool_choice`` auto / none /     ``tool_choice`` auto / none / required /
any / tool                        ``{type: function, function: {name}}``
``stop_reason`` end_turn /        ``finish_reason`` stop / length / tool_calls
max_tokens / tool_use
``usage.input_tokens`` (uncached  ``prompt_tokens`` = input + cache_creation +
only) + cache counters            cache_read; ``cached_tokens`` = cache_read
================================  ==================================================

``cache_control`` breakpoints have no Chat Completions equivalent: :func:`pin_ttl_s`
reads the longest TTL a Messages body asks for (``"5m"`` = 300 s, ``"1h"`` = 3600 s).
Only text content is translated (images and documents are rejected by the caller).

Block boundaries: our server joins a message's text blocks (``keep_text_blocks=False``);
the gateway keeps them (``keep_text_blocks=True``): two or more text blocks become as many
Chat Completions text parts ``{"type": "text", "text": T}``, and :func:`chat_to_messages`
turns text parts back into one text block each (a part's ``cache_control`` kept), so the
text reaches a Messages upstream exactly as the client sent it.
"""
from __future__ import annotations

import json
from typing import Any

TTL_S = {"5m": 300.0, "1h": 3600.0}
STOP_TO_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                  "tool_use": "tool_calls"}
FINISH_TO_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_TOOL_CHOICE = {"auto": "auto", "none": "none", "any": "required"}


class WireError(ValueError):
    """A body that cannot be translated; ``param`` names the field at fault."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def _text_of(blocks: Any, param: str) -> str:
    return "".join(_texts_of(blocks, param))


def _texts_of(blocks: Any, param: str) -> list[str]:
    """The texts of a string (one) or of an array of text blocks (one per block)."""
    if isinstance(blocks, str):
        return [blocks]
    if not isinstance(blocks, list):
        raise WireError(f"{param} must be a string or an array of content blocks", param)
    parts = []
    for i, b in enumerate(blocks):
        if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(
                b.get("text"), str):
            raise WireError("only text content blocks are supported here", f"{param}[{i}]")
        parts.append(b["text"])
    return parts


def _chat_content(texts: list[str], keep_text_blocks: bool) -> str | list[dict]:
    """Chat ``content`` for a message's texts: one string, or (``keep_text_blocks`` and
    two or more texts) one text part per text."""
    if keep_text_blocks and len(texts) > 1:
        return [{"type": "text", "text": t} for t in texts]
    return "".join(texts)


def pin_ttl_s(body: dict) -> float | None:
    """The longest ``cache_control`` TTL anywhere in a Messages body, seconds (``None``
    when it has no breakpoint). Raises WireError for an unknown ``ttl``."""
    found: list[float] = []

    def visit(obj: Any, param: str) -> None:
        if isinstance(obj, dict):
            cc = obj.get("cache_control")
            if cc is not None:
                ttl = cc.get("ttl", "5m") if isinstance(cc, dict) else None
                if ttl not in TTL_S:
                    raise WireError("cache_control must be {'type': 'ephemeral', 'ttl': "
                                    "'5m' | '1h'}", f"{param}.cache_control")
                found.append(TTL_S[ttl])
            for k, v in obj.items():
                if k != "cache_control":
                    visit(v, f"{param}.{k}" if param else k)
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                visit(v, f"{param}[{i}]")

    visit(body, "")
    return max(found) if found else None


def messages_to_chat(body: dict, *, keep_text_blocks: bool = False) -> dict:
    """A Messages request body as a Chat Completions body (``keep_text_blocks``: several
    text blocks of one message become text parts instead of one joined string). Raises
    WireError."""
    out: dict[str, Any] = {"model": body.get("model")}
    msgs: list[dict] = []
    if body.get("system") is not None:
        msgs.append({"role": "system", "content": _chat_content(
            _texts_of(body["system"], "system"), keep_text_blocks)})
    if not isinstance(body.get("messages"), list):
        raise WireError("messages must be an array", "messages")
    for i, m in enumerate(body["messages"]):
        msgs.extend(_message_to_chat(m, f"messages[{i}]", keep_text_blocks))
    out["messages"] = msgs
    if "max_tokens" in body:
        out["max_tokens"] = body["max_tokens"]
    for name in ("temperature", "top_p", "top_k", "stream"):
        if name in body:
            out[name] = body[name]
    if body.get("stop_sequences"):
        out["stop"] = body["stop_sequences"]
    if body.get("tools"):
        if not isinstance(body["tools"], list) or not all(
                isinstance(t, dict) for t in body["tools"]):
            raise WireError("tools must be an array of tool objects", "tools")
        out["tools"] = [{"type": "function", "function": {
            "name": t.get("name"), "description": t.get("description", ""),
            "parameters": t.get("input_schema", {})}} for t in body["tools"]]
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    if isinstance(tc, dict) and tc.get("type") in _TOOL_CHOICE:
        out["tool_choice"] = _TOOL_CHOICE[tc["type"]]
    elif isinstance(tc, dict) and tc.get("type") == "tool":
        out["tool_choice"] = {"type": "function", "function": {"name": tc.get("name")}}
    return out


def _message_to_chat(m: Any, param: str, keep_text_blocks: bool) -> list[dict]:
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
        raise WireError("each message needs role 'user' or 'assistant'", f"{param}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": m["role"], "content": content}]
    if not isinstance(content, list):
        raise WireError("content must be a string or an array of blocks", f"{param}.content")
    text, calls, results = [], [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text":
            text.append(str(b.get("text", "")))
        elif kind == "tool_use":
            calls.append({"id": b.get("id"), "type": "function", "function": {
                "name": b.get("name"), "arguments": json.dumps(b.get("input", {}))}})
        elif kind == "tool_result":
            c = b.get("content", "")
            results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"),
                            "content": _text_of(c, f"{param}.content[{j}].content")})
        else:
            raise WireError(f"content block type {kind!r} is not supported",
                            f"{param}.content[{j}]")
    out: list[dict] = list(results)
    if text or calls or not results:
        msg: dict[str, Any] = {"role": m["role"],
                               "content": _chat_content(text, keep_text_blocks)}
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def chat_to_messages(body: dict, *, default_max_tokens: int = 1024) -> dict:
    """A Chat Completions body as a Messages body (system messages joined into
    ``system``; ``max_tokens`` required by Messages, ``default_max_tokens`` if unset)."""
    system = [m.get("content") or "" for m in body.get("messages", [])
              if m.get("role") in ("system", "developer")]
    out: dict[str, Any] = {"model": body.get("model"),
                           "max_tokens": body.get("max_completion_tokens")
                           or body.get("max_tokens") or default_max_tokens}
    if system and all(isinstance(s, str) for s in system):
        out["system"] = [{"type": "text", "text": "\n\n".join(system)}]
    elif system:  # text parts: one block each, as sent
        out["system"] = [b for s in system for b in _text_blocks(s, "messages")]
    msgs: list[dict] = []
    for m in body.get("messages", []):
        role = m.get("role")
        if role in ("system", "developer"):
            continue
        content = m.get("content") or ""
        if role == "tool":
            text = content if isinstance(content, str) else _text_of(content, "messages")
            blocks: list[dict] = [{"type": "tool_result", "tool_use_id": m.get("tool_call_id"),
                                   "content": text}]
            role = "user"
        else:
            blocks = [b for b in _text_blocks(content, "messages") if b["text"]]
            if not blocks and role == "user":
                blocks = [{"type": "text", "text": ""}]
        for c in m.get("tool_calls") or []:
            fn = c.get("function", {})
            blocks.append({"type": "tool_use", "id": c.get("id"), "name": fn.get("name"),
                           "input": json.loads(fn.get("arguments") or "{}")})
        if msgs and msgs[-1]["role"] == role:  # Messages alternates roles
            msgs[-1]["content"].extend(blocks)
        else:
            msgs.append({"role": role, "content": blocks})
    out["messages"] = msgs
    for name in ("temperature", "top_p", "top_k", "stream"):
        if body.get(name) is not None:
            out[name] = body[name]
    if body.get("stop"):
        stop = body["stop"]
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if body.get("tools"):
        out["tools"] = [{"name": t["function"]["name"],
                         "description": t["function"].get("description", ""),
                         "input_schema": t["function"].get("parameters", {})}
                        for t in body["tools"]]
    return out


def _text_blocks(content: Any, param: str) -> list[dict]:
    """Messages text blocks of a chat ``content``: a string is one block; each text part
    is one block, its ``cache_control`` (a client's breakpoint) kept."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    texts = _texts_of(content, param)
    return [{"type": "text", "text": t, **({"cache_control": p["cache_control"]}
                                           if p.get("cache_control") else {})}
            for t, p in zip(texts, content)]


def anthropic_usage(prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                    cache_write_tokens: int = 0, write_ttl: str = "5m") -> dict:
    """A Messages ``usage`` object (``input_tokens`` counts uncached, unwritten tokens)."""
    ttl = "ephemeral_1h_input_tokens" if write_ttl == "1h" else "ephemeral_5m_input_tokens"
    return {"input_tokens": prompt_tokens - cached_tokens - cache_write_tokens,
            "cache_creation_input_tokens": cache_write_tokens,
            "cache_read_input_tokens": cached_tokens,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0,
                               ttl: cache_write_tokens},
            "output_tokens": completion_tokens}


def tool_use_id(call_id: str | None) -> str | None:
    """A Messages tool-use id for an OpenAI call id (``call_X`` -> ``toolu_X``; other
    ids unchanged)."""
    if isinstance(call_id, str) and call_id.startswith("call_"):
        return "toolu_" + call_id[len("call_"):]
    return call_id


def tool_use_blocks(tool_calls: list[dict]) -> list[dict]:
    """OpenAI ``tool_calls`` as Messages ``tool_use`` blocks (arguments parsed; text that
    is not JSON becomes ``{"arguments": text}``)."""
    out = []
    for c in tool_calls:
        fn = c.get("function") or {}
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = {"arguments": fn.get("arguments")}
        out.append({"type": "tool_use", "id": c.get("id"), "name": fn.get("name"),
                    "input": args})
    return out


def tool_calls_of(blocks: list[dict]) -> list[dict]:
    """Messages ``tool_use`` blocks as OpenAI ``tool_calls``."""
    return [{"id": b.get("id"), "type": "function", "function": {
        "name": b.get("name"), "arguments": json.dumps(b.get("input") or {})}}
        for b in blocks if b.get("type") == "tool_use"]


def message_response(msg_id: str, model: str, text: str, finish_reason: str | None,
                     usage: dict, tool_calls: list[dict] | None = None) -> dict:
    """A Messages response body: one text block, then a ``tool_use`` block per call."""
    content = [{"type": "text", "text": text}] if text or not tool_calls else []
    return {"id": msg_id, "type": "message", "role": "assistant", "model": model,
            "content": content + tool_use_blocks(tool_calls or []),
            "stop_reason": FINISH_TO_STOP.get(finish_reason or "stop", "end_turn"),
            "stop_sequence": None, "usage": usage}


def error_body(message: str, type: str = "invalid_request_error") -> dict:
    """An Anthropic-style error object."""
    return {"type": "error", "error": {"type": type, "message": message}}
