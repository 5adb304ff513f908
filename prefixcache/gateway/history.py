"""Prefix breakers the gateway can see: volatile text near the start of a prompt, and
conversation history rewritten between turns.

Volatile prefix: each prompt is compared with the tenant's previous prompt for the same
model using ``prefixcache analyze``'s breaker detection (:func:`~prefixcache.analyze.
breakers.lcp` and :func:`~prefixcache.analyze.breakers.realign`, here over characters):
when the two diverge within the first ``head_chars`` characters, realign shortly after,
and the divergent span holds a digit (a timestamp, a date, a UUID), every request pays
for the whole prompt again. It is logged and counted.

Rewritten history: a session (tenant + system prompt + first user message) is expected to
grow by appending: turn N+1's messages start with turn N's messages and the answer the
gateway returned. When an earlier message differs (reasoning stripped from an assistant
message, a tool result edited or truncated), the upstream recomputes everything from
there: the estimated tokens of the old conversation from the first changed message on
are counted per session and tenant. A request whose only new difference is its last
message (the user edited the latest turn: a branch) is not counted.
"""
from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from prefixcache.analyze.breakers import lcp, realign
from prefixcache.cache.hashing import blake2b_128, encode_parts
from prefixcache.gateway.shaping import estimate_tokens

log = logging.getLogger(__name__)
HEAD_CHARS = 2048
MIN_SHARED_CHARS = 64
MAX_SPAN_CHARS = 64
_DIGIT = re.compile(r"\d")


@dataclass
class Findings:
    volatile_span: str | None = None   # the divergent text, when volatile
    rewritten_tokens: int = 0          # tokens the upstream must recompute


def _chars(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


def volatile_span(prev: str, cur: str, head_chars: int = HEAD_CHARS) -> str | None:
    """The divergent value of ``cur`` when it and ``prev`` diverge within ``head_chars``
    on a short replaced value (at most 64 characters each side) holding a digit, and share
    at least 64 characters right after it; else ``None``."""
    a, b = _chars(prev), _chars(cur)
    d = lcp(a, b)
    if d >= min(head_chars, len(a), len(b)):
        return None
    found = realign(a, b, d, window=MAX_SPAN_CHARS, min_shared=MIN_SHARED_CHARS)
    if found is None:
        return None
    i, j, _ = found
    if not (0 < i <= MAX_SPAN_CHARS and 0 < j <= MAX_SPAN_CHARS):
        return None  # an insertion or a long rewrite, not a changing value
    start = d
    while start > 0 and cur[start - 1].isalnum():  # the whole value: "10:52", not "52"
        start -= 1
    span = cur[start:d + j]
    return span if _DIGIT.search(span) else None


def _flat(m: dict) -> str:
    c = m.get("content")
    return f"{m.get('role')}\x00{c if isinstance(c, str) else repr(c)}\x00" \
           f"{m.get('tool_calls')!r}"


class HistoryWatch:
    """Remembers the latest prompt per (tenant, model) and the latest turn per session
    (at most ``max_sessions``, least recently used forgotten)."""

    def __init__(self, max_sessions: int = 10_000):
        self.max_sessions = max_sessions
        self._last_prompt: OrderedDict[tuple, str] = OrderedDict()
        self._sessions: OrderedDict[bytes, list[str]] = OrderedDict()

    def observe(self, tenant: str | None, body: dict) -> Findings:
        """Check a chat body before it is forwarded."""
        msgs = body.get("messages") or []
        text = "".join(_flat(m) for m in msgs)
        found = Findings()
        where = (tenant, body.get("model"))
        prev = self._last_prompt.get(where)
        if prev is not None and prev != text:
            found.volatile_span = volatile_span(prev, text)
            if found.volatile_span is not None:
                log.warning("tenant %s: volatile text %r near the start of the prompt "
                            "breaks the upstream's prefix cache", tenant,
                            found.volatile_span[-40:])
        self._remember(self._last_prompt, where, text)
        session = self._session_key(tenant, msgs)
        if session is not None:
            old = self._sessions.get(session)
            flat = [_flat(m) for m in msgs]
            if old is not None:
                k = next((i for i, (x, y) in enumerate(zip(old, flat)) if x != y), None)
                if k is not None and k < len(flat) - 1:  # not just a new branch
                    found.rewritten_tokens = sum(estimate_tokens(s) for s in old[k:])
            self._remember(self._sessions, session, flat)
        return found

    def answered(self, tenant: str | None, body: dict, text: str) -> None:
        """Record the answer returned for ``body`` (the next turn should repeat it)."""
        session = self._session_key(tenant, body.get("messages") or [])
        if session is not None and session in self._sessions:
            self._sessions[session] = [*self._sessions[session],
                                       _flat({"role": "assistant", "content": text})]

    @staticmethod
    def _session_key(tenant: str | None, msgs: list[dict]) -> bytes | None:
        system = [_flat(m) for m in msgs if m.get("role") in ("system", "developer")]
        first = next((_flat(m) for m in msgs if m.get("role") == "user"), None)
        return None if first is None else blake2b_128(encode_parts(tenant, system, first))

    def _remember(self, table: OrderedDict, key, value) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.max_sessions:
            table.popitem(last=False)
