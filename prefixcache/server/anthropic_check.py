"""The shape of a Messages request body, checked before it is translated.

:func:`check_body` rejects, with a :class:`~.anthropic_wire.WireError` naming the field
(``messages[0].content[1].text``), what Anthropic's API rejects and what our engine
cannot honour:

- ``model`` (non-empty string) and ``max_tokens`` (integer >= 1) are required;
  ``messages`` is a non-empty array of ``{role: user | assistant, content}``, content a
  string or an array of ``text`` / ``tool_use`` / ``tool_result`` blocks (images and
  documents are not supported); ``system`` is a string or an array of text blocks;
- ``tools`` is an array of ``{name, input_schema, description?}`` (custom tools only);
  ``tool_choice`` is ``{type: auto | any | tool | none}`` (``tool`` with the ``name``
  of one of ``tools``; ``any`` and ``tool`` need tools), served as on
  ``/v1/chat/completions``;
- ``temperature`` in [0, 1] (Anthropic's range), ``top_p`` in (0, 1], ``top_k`` an
  integer >= 0, ``stop_sequences`` an array of strings, ``stream`` a boolean,
  ``metadata`` an object; ``thinking`` is not supported (only ``{"type": "disabled"}``);
- ``cache_control`` (on the body, system and content blocks, tools) is exactly
  ``{"type": "ephemeral", "ttl"?: "5m" | "1h"}``.

It returns the longest ``cache_control`` TTL, seconds (``None``: no breakpoint).
"""
from __future__ import annotations

from typing import Any

from prefixcache.server.anthropic_wire import TTL_S, WireError

_BLOCK_TYPES = ("text", "tool_use", "tool_result")
_CACHE_CONTROL = "cache_control must be {'type': 'ephemeral', 'ttl': '5m' | '1h'}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _need(ok: bool, message: str, param: str) -> None:
    if not ok:
        raise WireError(message, param)


class _Checker:
    """One body's checks; ``ttls`` collects the TTLs of its ``cache_control``s."""

    def __init__(self) -> None:
        self.ttls: list[float] = []

    def cache_control(self, obj: dict, param: str) -> None:
        if "cache_control" not in obj or obj["cache_control"] is None:
            return
        cc, param = obj["cache_control"], f"{param}.cache_control" if param else "cache_control"
        _need(isinstance(cc, dict) and cc.get("type") == "ephemeral"
              and cc.get("ttl", "5m") in TTL_S and set(cc) <= {"type", "ttl"},
              _CACHE_CONTROL, param)
        self.ttls.append(TTL_S[cc.get("ttl", "5m")])

    def text_block(self, b: Any, param: str) -> None:
        _need(isinstance(b, dict) and b.get("type") == "text",
              "only text content blocks ({'type': 'text', 'text': ...}) are supported here",
              param)
        _need(isinstance(b.get("text"), str), "text must be a string", f"{param}.text")
        self.cache_control(b, param)

    def text_or_blocks(self, v: Any, param: str) -> None:
        if isinstance(v, str):
            return
        _need(isinstance(v, list), f"{param} must be a string or an array of text blocks",
              param)
        for i, b in enumerate(v):
            self.text_block(b, f"{param}[{i}]")

    def block(self, b: Any, param: str) -> None:
        kind = b.get("type") if isinstance(b, dict) else None
        _need(isinstance(b, dict), "a content block must be an object", param)
        _need(kind in _BLOCK_TYPES, f"content block type {kind!r} is not supported; only "
              "'text', 'tool_use' and 'tool_result'", param)
        if kind == "text":
            self.text_block(b, param)
            return
        if kind == "tool_use":
            for name in ("id", "name"):
                _need(isinstance(b.get(name), str) and b[name] != "",
                      f"{name} must be a non-empty string", f"{param}.{name}")
            _need(isinstance(b.get("input"), dict), "input must be an object",
                  f"{param}.input")
        else:
            _need(isinstance(b.get("tool_use_id"), str) and b["tool_use_id"] != "",
                  "tool_use_id must be a non-empty string", f"{param}.tool_use_id")
            if b.get("content") is not None:
                self.text_or_blocks(b["content"], f"{param}.content")
            _need(isinstance(b.get("is_error", False), bool), "is_error must be a boolean",
                  f"{param}.is_error")
        self.cache_control(b, param)

    def message(self, m: Any, param: str) -> None:
        _need(isinstance(m, dict), "each message must be an object", param)
        _need(m.get("role") in ("user", "assistant"),
              "role must be 'user' or 'assistant'", f"{param}.role")
        content = m.get("content")
        if isinstance(content, str):
            return
        _need(isinstance(content, list), "content must be a string or an array of "
              "content blocks", f"{param}.content")
        for j, b in enumerate(content):
            self.block(b, f"{param}.content[{j}]")

    def tool(self, t: Any, param: str) -> None:
        _need(isinstance(t, dict), "each tool must be an object", param)
        _need(t.get("type", "custom") in ("custom", None),
              f"tool type {t.get('type')!r} is not supported; only custom tools", param)
        _need(isinstance(t.get("name"), str) and t["name"] != "",
              "name must be a non-empty string", f"{param}.name")
        _need(isinstance(t.get("input_schema"), dict), "input_schema must be an object",
              f"{param}.input_schema")
        _need(isinstance(t.get("description", ""), str), "description must be a string",
              f"{param}.description")
        self.cache_control(t, param)


def check_body(body: dict) -> float | None:
    """Check a Messages body (a JSON object); the longest ``cache_control`` TTL in it,
    seconds, or ``None``. Raises :class:`WireError` naming the field at fault."""
    c = _Checker()
    _need(isinstance(body.get("model"), str) and body["model"] != "",
          "model is required and must be a non-empty string", "model")
    _need(_is_int(body.get("max_tokens")) and body["max_tokens"] >= 1,
          "max_tokens is required and must be a positive integer", "max_tokens")
    msgs = body.get("messages")
    _need(isinstance(msgs, list) and len(msgs) > 0,
          "messages is required and must be a non-empty array", "messages")
    for i, m in enumerate(msgs or ()):
        c.message(m, f"messages[{i}]")
    if body.get("system") is not None:
        c.text_or_blocks(body["system"], "system")
    _check_sampling(body)
    _check_tools(body, c)
    c.cache_control(body, "")
    return max(c.ttls) if c.ttls else None


def _check_sampling(body: dict) -> None:
    def opt(name: str, ok: Any, message: str) -> None:
        if body.get(name) is not None:
            _need(ok(body[name]), f"{name} {message}", name)

    opt("temperature", lambda v: _is_num(v) and 0 <= v <= 1, "must be a number in [0, 1]")
    opt("top_p", lambda v: _is_num(v) and 0 < v <= 1, "must be a number in (0, 1]")
    opt("top_k", lambda v: _is_int(v) and v >= 0, "must be an integer >= 0")
    opt("stop_sequences", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v),
        "must be an array of strings")
    opt("stream", lambda v: isinstance(v, bool), "must be a boolean")
    opt("metadata", lambda v: isinstance(v, dict) and isinstance(v.get("user_id", ""),
                                                                 (str, type(None))),
        "must be an object (user_id: a string)")
    opt("thinking", lambda v: v == {"type": "disabled"},
        "is not supported by this server (extended thinking); omit it")


def _check_tools(body: dict, c: _Checker) -> None:
    tools = body.get("tools")
    if tools is not None:
        _need(isinstance(tools, list), "tools must be an array of tools", "tools")
        for i, t in enumerate(tools):
            c.tool(t, f"tools[{i}]")
    tc = body.get("tool_choice")
    if tc is None:
        return
    _need(isinstance(tc, dict) and tc.get("type") in ("auto", "any", "tool", "none"),
          "tool_choice must be {'type': 'auto' | 'any' | 'tool' | 'none'}", "tool_choice")
    names = {t.get("name") for t in tools or () if isinstance(t, dict)}
    if tc["type"] in ("any", "tool"):
        _need(bool(names), f"tool_choice {tc['type']!r} needs a non-empty tools list",
              "tool_choice")
    if tc["type"] == "tool":
        _need(isinstance(tc.get("name"), str) and tc["name"] in names,
              "tool_choice.name must name one of tools", "tool_choice.name")
    _need(isinstance(tc.get("disable_parallel_tool_use", False), bool),
          "disable_parallel_tool_use must be a boolean",
          "tool_choice.disable_parallel_tool_use")
