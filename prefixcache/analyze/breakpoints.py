"""Anthropic-style explicit caching: which prompt prefixes are cached, read and written.

Anthropic caches a prompt prefix only where the request puts a ``cache_control``
breakpoint, at most ``max_breakpoints`` (4) per request, and only when that prefix is
at least the model's minimum cacheable length. A later request reads the longest
cached prefix it repeats exactly; a read refreshes the entry's TTL.

Our model of how a client places breakpoints (logs do not record them):

- Breakpoints sit at message boundaries (the end of the tools block or of a message).
- One goes at the end of the static prefix (tools and leading system messages), the
  rest (``max_breakpoints - 1``) at the latest message boundaries, the usual
  placement for multi-turn chats and agent loops. Boundaries shorter than the minimum
  cacheable length are dropped.
- A read may hit at any message boundary up to the last breakpoint whose prefix an
  earlier request of the same namespace cached (Anthropic looks back from each
  breakpoint over earlier block boundaries for a hit).

Per request: ``read`` = the longest such cached prefix (0 if none), ``write`` = last
breakpoint - ``read`` when positive (the new part up to the last breakpoint is written;
every breakpoint past ``read`` becomes an entry), the rest of the prompt is uncached
input. Entries expire ``ttl_seconds`` after their last write or read (when the log has
timestamps).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from prefixcache.cache.hashing import tokens_to_bytes

STATIC_ROLES = frozenset({"tools", "system", "developer"})


@dataclass
class BreakpointCall:
    read: int
    write: int
    breakpoints: list[int]


def choose_breakpoints(boundaries: list[int], roles: list[str], max_breakpoints: int,
                       min_tokens: int) -> list[int]:
    """Breakpoint positions (ascending) per the model in the module docstring: the end
    of the static prefix, then the latest boundaries, all at least ``min_tokens``."""
    cands = sorted({b for b in boundaries if b > 0 and b >= min_tokens})
    static = None
    for b, role in zip(boundaries, roles):
        if role not in STATIC_ROLES:
            break
        static = b
    chosen: list[int] = []
    if static is not None and static in cands and max_breakpoints > 0:
        chosen.append(static)
    for b in reversed(cands):
        if len(chosen) >= max_breakpoints:
            break
        if b not in chosen:
            chosen.append(b)
    return sorted(chosen)


class BreakpointCache:
    """Cached prefixes keyed by namespace and prefix hash, with last-use times."""

    def __init__(self, max_breakpoints: int = 4, min_tokens: int = 0,
                 ttl_seconds: float | None = None):
        self.max_breakpoints = max_breakpoints
        self.min_tokens = min_tokens
        self.ttl = ttl_seconds
        self.entries: dict[tuple, float | None] = {}

    def _alive(self, key: tuple, now: float | None) -> bool:
        if key not in self.entries:
            return False
        last = self.entries[key]
        return not (self.ttl and now is not None and last is not None
                    and now - last > self.ttl)

    def call(self, namespace: tuple, ids: list[int], boundaries: list[int],
             roles: list[str], now: float | None = None) -> BreakpointCall:
        bps = choose_breakpoints(boundaries, roles, self.max_breakpoints, self.min_tokens)
        if not bps:
            return BreakpointCall(0, 0, [])
        last_bp = bps[-1]
        points = sorted({b for b in boundaries if 0 < b <= last_bp} | set(bps))
        digests: dict[int, bytes] = {}
        h = hashlib.blake2b(digest_size=16)
        pos = 0
        for b in points:
            h.update(tokens_to_bytes(ids[pos:b]))
            pos = b
            digests[b] = h.copy().digest()
        read = 0
        for b in reversed(points):
            if self._alive((namespace, digests[b]), now):
                read = b
                break
        if read:
            self.entries[(namespace, digests[read])] = now
        for b in bps:
            if b > read:
                self.entries[(namespace, digests[b])] = now
        return BreakpointCall(read, max(0, last_bp - read), bps)
