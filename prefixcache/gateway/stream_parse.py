"""Upstream server-sent events read back: one chunk or event at a time, the text delta,
the finish reason, the usage and the tool calls it carries.

OpenAI chunks: ``choices[].delta.content`` (``choices[].text`` for completions),
``delta.tool_calls[]`` by ``index`` (id and name first, arguments in pieces),
``finish_reason``, and ``usage`` on the last chunk. Anthropic events: ``message_start``
(usage), ``content_block_start`` (a ``tool_use`` block's id and name),
``content_block_delta`` (``text_delta`` or ``input_json_delta``), ``message_delta``
(stop reason, usage), ``message_stop``.
"""
from __future__ import annotations

from prefixcache.server import anthropic_wire as wire


class ToolCalls:
    """Tool calls assembled from stream deltas, by their index in the answer."""

    def __init__(self) -> None:
        self._by_index: dict[int, dict] = {}

    def add(self, index: int, id: str | None = None, name: str | None = None,
            arguments: str = "") -> None:
        call = self._by_index.setdefault(index, {"id": None, "name": None, "arguments": ""})
        call["id"] = id or call["id"]
        call["name"] = name or call["name"]
        call["arguments"] += arguments or ""

    def calls(self) -> list[dict]:
        return [{"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self._by_index.items())]


def openai_chunk(obj: dict, kind: str, tools: ToolCalls
                  ) -> tuple[str, str | None, dict | None]:
    delta, finish = "", None
    for c in obj.get("choices") or []:
        d = c.get("delta") or {}
        delta += (d.get("content") or "") if kind == "chat" else (c.get("text") or "")
        for t in d.get("tool_calls") or []:
            fn = t.get("function") or {}
            tools.add(int(t.get("index", 0)), t.get("id"), fn.get("name"),
                      fn.get("arguments") or "")
        finish = c.get("finish_reason") or finish
    return delta, finish, obj.get("usage") or None


def anthropic_event(obj: dict, ended: bool, tools: ToolCalls
                     ) -> tuple[str, str | None, dict | None, bool]:
    kind = obj.get("type")
    if kind == "message_start":
        return "", None, (obj.get("message") or {}).get("usage"), ended
    if kind == "content_block_start":
        block = obj.get("content_block") or {}
        if block.get("type") == "tool_use":
            tools.add(int(obj.get("index", 0)), block.get("id"), block.get("name"))
        return "", None, None, ended
    if kind == "content_block_delta":
        d = obj.get("delta") or {}
        if d.get("type") == "input_json_delta":
            tools.add(int(obj.get("index", 0)), arguments=d.get("partial_json") or "")
            return "", None, None, ended
        return d.get("text", ""), None, None, ended
    if kind == "message_delta":
        stop = (obj.get("delta") or {}).get("stop_reason")
        return "", wire.STOP_TO_FINISH.get(stop, "stop") if stop else None, obj.get(
            "usage"), ended
    return "", None, None, ended or kind == "message_stop"
