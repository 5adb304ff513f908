"""Mistral calls after the ``[TOOL_CALLS]`` special token, in either of Mistral's forms::

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]
    [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}      (newer tokenizers; repeatable)

Text before the marker is content; an output whose calls do not parse is content, as
written. The markers are special tokens: the server decodes them (``skip_special_tokens``
off) when this parser is used.
"""
from __future__ import annotations

import json

from prefixcache.text.tool_parsers.base import (
    PartialCall,
    Snapshot,
    ToolParser,
    arguments_text,
    call_object,
    held_back,
)

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
_KEYS = ("arguments", "parameters")
_DECODER = json.JSONDecoder()


class MistralParser(ToolParser):
    name = "mistral"
    skip_special_tokens = False

    def snapshot(self, text: str, final: bool) -> Snapshot:
        j = text.find(MARKER)
        if j < 0:
            return Snapshot(text if final
                            else text[:len(text) - held_back(text, MARKER)].rstrip())
        content, body = text[:j], text[j + len(MARKER):]
        calls = (_array_calls(body, final) if body.lstrip().startswith("[")
                 else _args_calls(body, final))
        if calls is None:
            return Snapshot(text if final else content.rstrip())
        return Snapshot(content.rstrip(), calls)


def _array_calls(body: str, final: bool) -> list[PartialCall] | None:
    calls: list[PartialCall] = []
    pos = _skip(body, body.index("[") + 1)
    while pos < len(body):
        if body[pos] == "]" and not calls:
            return None
        call, end = call_object(body, pos, _KEYS)
        if call is None or (end < 0 and final):
            return None
        calls.append(call)
        if end < 0:
            return calls
        pos = _skip(body, end)
        if pos < len(body) and body[pos] == "]":
            return calls if not body[pos + 1:].strip() or not final else None
        if pos < len(body):
            if body[pos] != ",":
                return None
            pos = _skip(body, pos + 1)
    return None if final else calls


def _args_calls(body: str, final: bool) -> list[PartialCall] | None:
    """``name[ARGS]{...}`` repeated."""
    calls: list[PartialCall] = []
    pos = 0
    while pos < len(body):
        k = body.find(ARGS, pos)
        if k < 0:
            return None if final else calls
        name = body[pos:k].strip()
        if not name or any(ch.isspace() for ch in name):
            return None
        start = _skip(body, k + len(ARGS))
        try:
            args, end = _DECODER.raw_decode(body, start)
        except json.JSONDecodeError:
            if final:
                return None
            rest = body[start:].rstrip()
            calls.append(PartialCall(name, rest))
            return calls
        if not isinstance(args, dict):
            return None
        text = body[start:end]
        calls.append(PartialCall(name, text if json.loads(text) == args
                                 else arguments_text(args), done=True))
        pos = _skip(body, end)
    return calls if calls or not final else None


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i
