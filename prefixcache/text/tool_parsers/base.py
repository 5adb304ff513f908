"""What every tool-call parser shares: the call types, the parser interface, and the
helpers that read a call object that may still be incomplete (streaming).

A parser turns the text generated so far into a :class:`Snapshot`: the content outside
calls, and the calls seen, each with its name (once complete) and its arguments text.
Snapshots of a growing text grow too (append-only), which is what the streaming driver
(:mod:`.streaming`) relies on:

- content that could still turn into the start of a call (a partial ``<tool_call>``
  tag, a leading ``{``) is held back until it is decided;
- an argument value still being written is reported without trailing ``}`` and
  whitespace (they may close the call object, not the arguments); once the value is
  complete its exact text is reported.

The final snapshot (``final=True``) keeps only calls that parse as JSON and have a
name; anything else stays content, as the model wrote it.
"""
from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    """One call: the function's ``name`` and its ``arguments`` as JSON text."""

    name: str
    arguments: str


@dataclass
class PartialCall:
    """A call in a snapshot: ``name`` is ``None`` until it is complete; ``arguments`` is
    the arguments text seen so far (complete when ``done``)."""

    name: str | None
    arguments: str = ""
    done: bool = False


@dataclass
class Snapshot:
    """The parse of a text: ``content`` outside calls, and the ``calls`` in order."""

    content: str = ""
    calls: list[PartialCall] = field(default_factory=list)

    def tool_calls(self) -> list[ToolCall]:
        """The complete calls (final snapshots have only complete ones)."""
        return [ToolCall(c.name, c.arguments) for c in self.calls
                if c.done and c.name is not None]


class ToolParser(ABC):
    """A tool-call syntax. ``skip_special_tokens``: whether its markers survive decoding
    with special tokens skipped (``False``: the server must decode them)."""

    name: str = ""
    skip_special_tokens: bool = True

    @abstractmethod
    def snapshot(self, text: str, final: bool) -> Snapshot:
        """Parse ``text`` (all the text generated so far); ``final``: the text is
        complete."""

    def extract(self, text: str) -> tuple[str, list[ToolCall]]:
        """``(content, calls)`` of a finished output; text that is not a valid call
        stays in ``content``."""
        snap = self.snapshot(text, final=True)
        return snap.content, snap.tool_calls()


def held_back(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``
    (those characters may still become the marker)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def arguments_text(value: object) -> str:
    """Arguments as JSON text, the way chat templates write them (``json.dumps``
    defaults, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def _args_span(text: str, start: int) -> tuple[str, bool]:
    """The arguments value that begins at ``text[start]``: its exact text and ``True``
    when it is complete JSON, else the text so far without a trailing ``}`` or
    whitespace, and ``False``."""
    try:
        _, end = _DECODER.raw_decode(text, start)
        return text[start:end], True
    except json.JSONDecodeError:
        return text[start:].rstrip().rstrip("}").rstrip(), False


def _name_head(keys: tuple[str, ...]) -> re.Pattern[str]:
    alt = "|".join(re.escape(k) for k in keys)
    return re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"'
                      r'(\s*,\s*"(?:' + alt + r')"\s*:\s*)?')


_HEADS: dict[tuple[str, ...], re.Pattern[str]] = {}


def call_object(text: str, pos: int, keys: tuple[str, ...]
                ) -> tuple[PartialCall | None, int]:
    """Read one call object ``{"name": ..., KEY: {...}}`` starting at ``text[pos]``
    (``keys``: the names the arguments may have, ``arguments`` or ``parameters``).

    Returns ``(call, end)``: a complete call and the index after it; an incomplete
    call (its name once its arguments object has begun, its arguments so far) and
    ``-1``; or ``(None, -2)``
    when the text there is complete JSON that is not a call (invalid). A complete
    call's arguments are the text the model wrote when it wrote the name first, so a
    stream's fragments add up to them."""
    head = _HEADS.setdefault(keys, _name_head(keys))
    m = head.match(text, pos)
    try:
        obj, end = _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        obj, end = None, -1
    if end >= 0:
        call = _as_call(obj, keys)
        if call is None:
            return None, -2
        if m is not None and m.group(2):
            span, complete = _args_span(text, m.end())
            if complete and _loads(span) == _loads(call.arguments):
                call.arguments = span
        return call, end
    if m is None:
        return PartialCall(None), -1
    name = _loads(f'"{m.group(1)}"')
    if not isinstance(name, str):
        return PartialCall(None), -1
    args = _args_span(text, m.end())[0] if m.group(2) else ""
    if not args.startswith("{"):  # a call is shown once its arguments object begins
        return PartialCall(None), -1
    return PartialCall(name, args), -1


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _as_call(obj: object, keys: tuple[str, ...]) -> PartialCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args: object = next((obj[k] for k in keys if k in obj), {})
    if isinstance(args, str):  # some models write the arguments as a JSON string
        args = _loads(args)
    if not isinstance(args, dict):
        return None
    return PartialCall(obj["name"], arguments_text(args), done=True)
