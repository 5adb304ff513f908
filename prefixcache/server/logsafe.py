"""Client-supplied text made safe for log lines.

A log line must never carry raw client text: a field name with a newline could forge a
line, an ANSI escape could rewrite a terminal, and a thousand 10 KB field names would
flood the log. :func:`clean` escapes every non-printable or non-ASCII character
(``\\n``, ``\\x1b``, ``\\u2028``) and truncates; :func:`name_list` bounds how many
names one line lists. One request therefore logs a bounded number of bytes.
"""
from __future__ import annotations

from typing import Iterable

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
