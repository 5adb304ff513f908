"""Llama 3.x JSON calls (the ``llama3_json`` parser of vLLM): the whole output is one or
more call objects, optionally after ``<|python_tag|>`` and separated by ``;``::

    <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}

(``"arguments"`` is accepted for ``"parameters"``). An output that does not start with
``{`` or the tag, or that does not parse as calls entirely, is content.
``<|python_tag|>`` is a special token: the server decodes it (``skip_special_tokens``
off) when this parser is used.
"""
from __future__ import annotations

from prefixcache.text.tool_parsers.base import PartialCall, Snapshot, ToolParser, call_object

TAG = "<|python_tag|>"
_KEYS = ("parameters", "arguments")


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    skip_special_tokens = False

    def snapshot(self, text: str, final: bool) -> Snapshot:
        body = text.lstrip()
        if not final and TAG.startswith(body):
            return Snapshot()  # undecided: nothing shown yet
        if body.startswith(TAG):
            body = body[len(TAG):]
        elif not body.startswith("{"):
            return Snapshot(text if final else text.rstrip())
        calls = _calls(body, final)
        if calls is None:
            return Snapshot(text) if final else Snapshot()
        return Snapshot("", calls)


def _calls(body: str, final: bool) -> list[PartialCall] | None:
    """The calls in ``body`` (``None``: not valid calls); a running text's last call may
    be incomplete."""
    calls: list[PartialCall] = []
    pos = _skip(body, 0)
    while pos < len(body):
        call, end = call_object(body, pos, _KEYS)
        if call is None or (end < 0 and final):
            return None
        calls.append(call)
        if end < 0:
            return calls
        pos = _skip(body, end)
        if pos < len(body):
            if body[pos] != ";":
                return None
            pos = _skip(body, pos + 1)
    return calls if calls or not final else None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
