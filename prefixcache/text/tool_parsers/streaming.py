"""The incremental tool-call parser of a stream: text deltas in, OpenAI-shaped events out.

:class:`StreamingToolParser` re-parses the text generated so far with a
:class:`~.base.ToolParser` after each delta and sends what the new snapshot adds:

- :class:`ContentDelta` for content outside calls (a partial start tag is never sent);
- :class:`CallStart` once a call's name is complete (index, a fresh ``call_...`` id,
  the name), then :class:`ArgumentsDelta` fragments of its arguments text, which add
  up to the final arguments.

:meth:`StreamingToolParser.finish` parses the complete text (calls must be valid there)
and sends the rest. Snapshots of a growing text only grow (see :mod:`.base`); a
snapshot that would take back something already sent is not sent from. Limitation: a
call is sent once its name and the start of its arguments object are written; if the
output then ends before the call is complete (``max_tokens``), the fragments already
sent stand and nothing more is sent (the finished response's body would show that
text as content).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

from prefixcache.text.tool_parsers.base import Snapshot, ToolParser


def new_call_id() -> str:
    """An OpenAI-style tool call id: ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ContentDelta:
    text: str


@dataclass
class CallStart:
    index: int
    id: str
    name: str


@dataclass
class ArgumentsDelta:
    index: int
    text: str


Event = ContentDelta | CallStart | ArgumentsDelta


class StreamingToolParser:
    """Feeds text deltas through ``parser`` (one per streamed choice)."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.text = ""
        self._content = 0                 # characters of content sent
        self._ids: list[str] = []         # ids of the calls started
        self._args: list[str] = []        # arguments text sent, per call

    @property
    def calls_started(self) -> int:
        """How many calls were sent (their name at least)."""
        return len(self._ids)

    def feed(self, delta: str) -> list[Event]:
        """The events that ``delta`` (new text) makes certain."""
        self.text += delta
        return self._diff(self.parser.snapshot(self.text, final=False))

    def finish(self) -> list[Event]:
        """The remaining events once the text is complete."""
        snap = self.parser.snapshot(self.text, final=True)
        if len(snap.calls) < len(self._ids):  # a started call never completed: stop here
            return []
        return self._diff(snap)

    def _diff(self, snap: Snapshot) -> list[Event]:
        events: list[Event] = []
        if len(snap.content) > self._content:
            events.append(ContentDelta(snap.content[self._content:]))
            self._content = len(snap.content)
        for i, call in enumerate(snap.calls):
            if call.name is None:
                break
            if i == len(self._ids):
                self._ids.append(new_call_id())
                self._args.append("")
                events.append(CallStart(i, self._ids[i], call.name))
            sent = self._args[i]
            if len(call.arguments) > len(sent) and call.arguments.startswith(sent):
                events.append(ArgumentsDelta(i, call.arguments[len(sent):]))
                self._args[i] = call.arguments
        return events
