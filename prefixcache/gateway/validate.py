"""Request bodies checked before the gateway reads them: parsing, then field types and ranges.

:func:`parse` refuses bodies that are not JSON, nested deeper than :data:`MAX_DEPTH`, or
holding a non-finite number (``NaN``, ``Infinity``, ``1e999``) anywhere: none of them
can be forwarded as JSON. :func:`check_fields` checks the fields the gateway reads or
translates, in the client's wire format (``chat``, ``completions`` or ``messages``).
Every error is a :class:`~prefixcache.gateway.requests.BadRequest` (HTTP 400) naming
the parameter at fault.
"""
from __future__ import annotations

import json
import math
from typing import Any

from prefixcache.gateway.requests import BadRequest

MAX_DEPTH = 64  # objects and arrays nested in the body, counting the body itself
CHAT_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# (low, high) of each float; OpenAI's temperature goes to 2, Anthropic's to 1.
OPENAI_RANGES = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0),
                 "presence_penalty": (-2.0, 2.0), "frequency_penalty": (-2.0, 2.0)}
MESSAGES_RANGES = {"temperature": (0.0, 1.0), "top_p": (0.0, 1.0)}


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(400, f"{param}: {message}", param)


def parse(raw: bytes) -> Any:
    """The JSON value of a request body. Raises BadRequest."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(400, f"the request body is not valid JSON: {exc}", None) from None
    except RecursionError:
        raise BadRequest(400, f"the request body is nested deeper than {MAX_DEPTH} levels",
                         None) from None
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    """Depth and finiteness of every value (iterative: a deep body cannot overflow)."""
    todo: list[tuple[Any, str, int]] = [(body, "", 1)]
    while todo:
        value, path, depth = todo.pop()
        if isinstance(value, float) and not math.isfinite(value):
            raise _bad(path or "body", "numbers must be finite (no NaN or Infinity)")
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise _bad(path.split("[")[0].split(".")[0] or "body",
                       f"the request body is nested deeper than {MAX_DEPTH} levels")
        items = (value.items() if isinstance(value, dict) else enumerate(value))
        for k, v in items:
            sub = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else k)
            todo.append((v, sub, depth + 1))


def _number(body: dict, name: str, low: float, high: float) -> None:
    v = body.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high:
        raise _bad(name, f"must be a number in [{low:g}, {high:g}], not {v!r}")


def _integer(body: dict, name: str, low: int, what: str = "") -> None:
    v = body.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _bad(name, f"must be an integer >= {what or low}, not {v!r}")


def _typed(body: dict, name: str, types: tuple[type, ...], what: str) -> None:
    v = body.get(name)
    if v is not None and not isinstance(v, types):
        raise _bad(name, f"must be {what}, not {v!r}")


def _strings(body: dict, name: str, one_allowed: bool) -> None:
    v = body.get(name)
    if v is None or (one_allowed and isinstance(v, str)):
        return
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise _bad(name, "must be " + ("a string or " if one_allowed else "")
                   + "an array of strings")


def check_fields(client: str, body: dict, *, min_max_tokens: int = 1) -> None:
    """Types and ranges of ``body``'s fields, read as ``client`` sends them. Raises
    BadRequest. ``min_max_tokens``: 0 where the upstream accepts it (our engine's
    completions: a prefill)."""
    messages = client == "messages"
    for name, (low, high) in (MESSAGES_RANGES if messages else OPENAI_RANGES).items():
        _number(body, name, low, high)
    _integer(body, "max_tokens", min_max_tokens,
             "1 (0, a prefill, for prefixcache upstreams only)" if min_max_tokens == 0 else "")
    _integer(body, "n", 1)
    _typed(body, "stream", (bool,), "true or false")
    _typed(body, "model", (str,), "a string")
    _typed(body, "metadata", (dict,), "an object")
    if messages:
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            raise _bad("messages", "must be a non-empty array")
        _integer(body, "top_k", 0)
        _strings(body, "stop_sequences", one_allowed=False)
        _tools(body, "name")
        return
    _typed(body, "stream_options", (dict,), "an object")
    _integer(body, "seed", -(2 ** 63))
    _strings(body, "stop", one_allowed=True)
    _tools(body, "function")
    if client == "chat":
        _integer(body, "max_completion_tokens", 1)
        _chat_messages(body.get("messages"))


def _tools(body: dict, key: str) -> None:
    """``tools``: an array of objects, each with a string name (at ``key`` for Messages,
    in its ``function`` object for chat)."""
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _bad("tools", "must be an array of tool objects")
    for i, t in enumerate(tools):
        named = t.get(key) if isinstance(t, dict) else None
        if key == "function":
            named = named.get("name") if isinstance(named, dict) else None
            what = "an object with a function object {name, description, parameters}"
        else:
            named = named if isinstance(named, str) else None
            what = "an object with a string name"
        if not isinstance(named, str) or not named:
            raise _bad(f"tools[{i}]", f"must be {what}")


def _chat_messages(msgs: Any) -> None:
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "must be a non-empty array")
    for i, m in enumerate(msgs):
        at = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(at, "each message must be an object")
        if m.get("role") not in CHAT_ROLES:
            raise _bad(f"{at}.role", f"role is required, one of {sorted(CHAT_ROLES)}")
        content = m.get("content")
        if content is not None and not isinstance(content, str) and not (
                isinstance(content, list)
                and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                        for p in content)):
            raise _bad(f"{at}.content", "must be a string, null or an array of content "
                       "parts {type, ...}")
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str)
                and isinstance(c["function"].get("arguments", ""), str) for c in calls)):
            raise _bad(f"{at}.tool_calls", "must be an array of {id, type, function: "
                       "{name, arguments}} objects")
