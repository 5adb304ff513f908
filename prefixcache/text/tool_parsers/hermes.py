"""Hermes-style calls, as Qwen2.5/Qwen3, Hermes and the SmolLM family write them::

    some content<tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Any number of calls; content may come before, between and after them (whitespace
around calls is dropped). A block that does not hold one valid call object stays
content, tags included.
"""
from __future__ import annotations

from prefixcache.text.tool_parsers.base import (
    PartialCall,
    Snapshot,
    ToolParser,
    call_object,
    held_back,
)

START, END = "<tool_call>", "</tool_call>"
_KEYS = ("arguments", "parameters")


class HermesParser(ToolParser):
    name = "hermes"

    def snapshot(self, text: str, final: bool) -> Snapshot:
        parts: list[str] = []
        calls: list[PartialCall] = []
        i = 0
        while True:
            j = text.find(START, i)
            if j < 0:
                rest = text[i:]
                parts.append(rest if final else rest[:len(rest) - held_back(rest, START)])
                break
            parts.append(text[i:j])
            body = j + len(START)
            pos = _skip_ws(text, body)
            call, end = call_object(text, pos, _KEYS)
            if call is not None and end >= 0:
                after = _skip_ws(text, end)
                if text.startswith(END, after):
                    calls.append(call)
                    i = after + len(END)
                    continue
                if not final and END.startswith(text[after:]):  # the end tag is coming
                    calls.append(call)
                    break
                if final and after == len(text):  # the output stopped before the end tag
                    calls.append(call)
                    break
            elif call is not None and not final:  # still being written
                calls.append(call)
                break
            # not a valid call: the block stays content, up to its end tag if any
            k = text.find(END, body)
            stop = len(text) if k < 0 else k + len(END)
            parts.append(text[j:stop])
            i = stop
            if k < 0:
                break
        return Snapshot(_join(parts, bool(calls), final), calls)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _join(parts: list[str], has_calls: bool, final: bool) -> str:
    """Content from the pieces between calls: whitespace-only pieces go when there
    are calls; a running text holds back its trailing whitespace (a call may follow)."""
    if has_calls:
        parts = [p for p in parts if p.strip()]
    content = "".join(parts)
    return content.rstrip() if has_calls or not final else content
