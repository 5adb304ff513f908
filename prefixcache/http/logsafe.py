"""Client-supplied text made safe for log lines.

A log line must never carry raw client text: a field name with a newline could forge a
line, an ANSI escape could rewrite a terminal, and a thousand 10 KB field names would
flood the log. :func:`clean` escapes every non-printable or non-ASCII character
(``\\n``, ``\\x1b``, ``\\u2028``) and truncates; :func:`name_list` bounds how many
names one line lists. One request therefore logs a bounded number of bytes.
:class:`SafeFormatter` (installed by ``prefixcache serve``) is the backstop for any
other log line: no control character is written raw, and traceback lines are indented.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

MAX_CHARS = 64      # per client string, after escaping
MAX_NAMES = 8       # names listed in one line; the rest are counted


def clean(text: str, limit: int = MAX_CHARS) -> str:
    """``text`` with control and non-ASCII characters backslash-escaped, cut to
    ``limit`` characters (marked with ``...``). The result is printable ASCII only."""
    escaped = ascii(text[:limit + 1])[1:-1]
    if len(escaped) > limit or len(text) > limit:
        return escaped[:limit] + "..."
    return escaped


def name_list(names: Iterable[str], limit: int = MAX_NAMES) -> str:
    """At most ``limit`` cleaned names, comma-separated, then ``(+N more)``."""
    names = list(names)
    shown = ", ".join(clean(n) for n in names[:limit])
    if len(names) > limit:
        shown += f" (+{len(names) - limit} more)"
    return shown


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f) if c != 0x09}
_CONTROL.update({0x0a: "\\n", 0x0d: "\\r", 0x2028: "\\u2028", 0x2029: "\\u2029"})
MAX_MESSAGE_CHARS = 4096


class SafeFormatter(logging.Formatter):
    """A log formatter that keeps every record on lines of its own: control characters
    in the message are escaped (a newline becomes ``\\n``), the message is cut at
    :data:`MAX_MESSAGE_CHARS`, and the lines of a traceback are indented, so text from a
    client can neither forge a record nor rewrite a terminal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        msg = record.message
        if len(msg) > MAX_MESSAGE_CHARS:
            msg = msg[:MAX_MESSAGE_CHARS] + f"... (+{len(msg) - MAX_MESSAGE_CHARS} chars)"
        record.message = msg.translate(_CONTROL)
        return super().formatMessage(record)

    def formatException(self, ei) -> str:
        lines = super().formatException(ei).split("\n")
        return "\n".join("    " + line.translate(_CONTROL) for line in lines)
