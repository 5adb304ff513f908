"""Cache breakers: places where prompts that share most of their text diverge early.

For each request B, a few earlier requests A of the same namespace (tenant and
cache salt; other namespaces never share pages) are compared with it: the previous
request of B's conversation, the previous request of the namespace, and the one among
the last ``lookback`` with the longest common prefix. A stands for what it published:
its prompt, then its recorded response (the engine publishes decode pages). For a pair:

1. ``d`` = their longest common token prefix: the **divergence** token index.
2. Re-alignment: the smallest ``j`` (then ``i``) such that ``A[d+i:]`` and ``B[d+j:]``
   start with the same ``anchor`` tokens, searched within ``window`` tokens of ``d``,
   keeping the first one after which they share at least ``min_shared`` tokens (``m``,
   the **shared-after** run). ``B[d:d+j]`` is B's divergent span (a timestamp, an id).
3. **Tokens cost**: had B's divergent span matched A's, B would have read
   ``would = floor_page(min(d + j + m, len(B) - 1))`` tokens from A's pages instead of
   what it read (``max(floor_page(d), hit)``, ``hit`` being B's replayed hit). The
   difference, when at least one page, makes the pair a breaker.

Each request keeps its costliest pair. Breakers are grouped by where they happen: the
role of the message holding the divergence and the last line of text before it, with trailing
words holding digits (dates, times, ids) removed (so "Current time: 10:41" and
"Current time: 10:52" group together).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

import numpy as np

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.textmap import prompt_context

ANCHOR_TOKENS = 8
WINDOW_TOKENS = 2048
MIN_SHARED_TOKENS = 32
LOOKBACK = 8


@dataclass
class Breaker:
    request_id: str
    partner_id: str
    tenant: str | None
    divergence_token: int
    span_tokens: int  # j: B's divergent span
    partner_span_tokens: int  # i: A's
    shared_after: int  # m
    tokens_cost: int
    divergence_char: int | None = None
    context: str = ""  # B around the divergence
    partner_context: str = ""  # A around the divergence
    message_index: int | None = None
    message_role: str | None = None
    key: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class BreakerGroup:
    key: str
    count: int
    tokens_cost: int
    example: Breaker
    request_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"key": self.key, "count": self.count, "tokens_cost": self.tokens_cost,
                "example": self.example.as_dict(), "request_ids": self.request_ids[:20]}


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two id arrays."""
    n = min(len(a), len(b))
    neq = np.flatnonzero(a[:n] != b[:n])
    return int(neq[0]) if len(neq) else n


def realign(a: np.ndarray, b: np.ndarray, d: int, *, anchor: int = ANCHOR_TOKENS,
            window: int = WINDOW_TOKENS, min_shared: int = MIN_SHARED_TOKENS
            ) -> tuple[int, int, int] | None:
    """``(i, j, m)``: ``A[d+i:]`` and ``B[d+j:]`` share ``m >= min_shared`` leading
    tokens, ``j`` smallest (see the module docstring); ``None`` if no such place."""
    a_last = min(len(a) - anchor, d + window)
    b_last = min(len(b) - anchor, d + window)
    if a_last < d or b_last < d:
        return None
    index: dict[bytes, list[int]] = {}
    for p in range(d, a_last + 1):
        index.setdefault(a[p:p + anchor].tobytes(), []).append(p)
    for q in range(d, b_last + 1):
        for p in index.get(b[q:q + anchor].tobytes(), ()):
            m = lcp(a[p:], b[q:])
            if m >= min_shared:
                return p - d, q - d, m
    return None


# Trailing words holding a digit (dates, times, counters, ids) or long hex runs, with
# their separators: "Current time: 2024-05-01 10:0" -> "Current time".
_TRAILING_VOLATILE = re.compile(
    r"(?:[\s:\-_./+,#]*(?:[0-9A-Za-z]*\d[0-9A-Za-z]*|[0-9a-fA-F]{6,}))+[\s:\-_./+,#]*$")


def group_key(tr: TokenizedRequest, char: int | None, role: str | None) -> str:
    """Where a divergence is: the role of its message and the last line of text
    before it, without trailing words that hold digits."""
    where = f"{role} message" if role else "prompt"
    if char is None or tr.prompt_text is None:
        return where
    before = _TRAILING_VOLATILE.sub("", tr.prompt_text[max(0, char - 80):char])
    lines = [ln.strip() for ln in before.split("\n") if ln.strip()]
    return f"{where}, after {lines[-1][-50:]!r}" if lines else where


def _pair(a: np.ndarray, b: np.ndarray, hit_b: int, bs: int, **kw
          ) -> tuple[int, int, int, int, int] | None:
    d = lcp(a, b)
    if d >= len(a) - kw.get("anchor", ANCHOR_TOKENS) or d >= len(b) - 1:
        return None
    found = realign(a, b, d, **kw)
    if found is None:
        return None
    i, j, m = found
    would = min(d + j + m, len(b) - 1) // bs * bs
    cost = would - max(d // bs * bs, hit_b)
    if cost < bs:
        return None
    return d, i, j, m, cost


def find_breakers(requests: list[TokenizedRequest], hits: list[int], block_size: int,
                  tokenizer=None, *, publish_responses: bool = True,
                  lookback: int = LOOKBACK, anchor: int = ANCHOR_TOKENS,
                  window: int = WINDOW_TOKENS, min_shared: int = MIN_SHARED_TOKENS
                  ) -> list[Breaker]:
    """One :class:`Breaker` per request that has one (its costliest pair).

    Args:
        hits: each request's replayed cached tokens (same order).
        tokenizer: for the text around the divergence (omitted: no text).
        publish_responses: as in the replay (a partner offers its response too).
    """
    kw = dict(anchor=anchor, window=window, min_shared=min_shared)
    arrays = [np.asarray(r.prompt_ids, dtype=np.int64) for r in requests]
    # A partner offers what it published: its prompt and its response (but the last
    # generated token, whose KV is never written).
    published = [np.asarray(r.prompt_ids + r.response_ids[:-1], dtype=np.int64)
                 if publish_responses and len(r.response_ids) > 1 else arrays[n]
                 for n, r in enumerate(requests)]
    by_ns: dict[tuple, list[int]] = {}
    last_in_conv: dict[tuple, int] = {}
    out: list[Breaker] = []
    for k, r in enumerate(requests):
        ns = (r.request.tenant, r.request.cache_salt)
        recent = by_ns.setdefault(ns, [])
        cands: list[int] = []
        conv = r.request.conversation
        if conv is not None and (ns, conv) in last_in_conv:
            cands.append(last_in_conv[(ns, conv)])
        if recent:
            cands.append(recent[-1])
            window_ids = recent[-lookback:]
            best = max(window_ids, key=lambda x: lcp(published[x], arrays[k]))
            cands.append(best)
        best_pair = None
        for a in dict.fromkeys(cands):
            got = _pair(published[a], arrays[k], hits[k], block_size, **kw)
            if got and (best_pair is None or got[4] > best_pair[1][4]):
                best_pair = (a, got)
        if best_pair is not None:
            a, (d, i, j, m, cost) = best_pair
            out.append(_describe(requests[a], r, d, i, j, m, cost, tokenizer))
        recent.append(k)
        if conv is not None:
            last_in_conv[(ns, conv)] = k
    return out


def _describe(ta: TokenizedRequest, tb: TokenizedRequest, d: int, i: int, j: int,
              m: int, cost: int, tokenizer) -> Breaker:
    msg = None
    if tb.boundaries:
        msg = next((n for n, end in enumerate(tb.boundaries) if d < end), None)
    br = Breaker(request_id=tb.request_id, partner_id=ta.request_id, tenant=tb.tenant,
                 divergence_token=d, span_tokens=j, partner_span_tokens=i,
                 shared_after=m, tokens_cost=cost, message_index=msg,
                 message_role=tb.boundary_roles[msg] if msg is not None
                 and msg < len(tb.boundary_roles) else None)
    if tokenizer is not None:
        br.divergence_char, br.context = prompt_context(tokenizer, tb, d)
        _, br.partner_context = prompt_context(tokenizer, ta, d)
    br.key = group_key(tb, br.divergence_char, br.message_role)
    return br


def group_breakers(breakers: list[Breaker], top: int | None = None) -> list[BreakerGroup]:
    """Breakers grouped by :attr:`Breaker.key`, costliest group first."""
    groups: dict[str, BreakerGroup] = {}
    for b in breakers:
        g = groups.get(b.key)
        if g is None:
            groups[b.key] = BreakerGroup(b.key, 1, b.tokens_cost, b, [b.request_id])
        else:
            g.count += 1
            g.tokens_cost += b.tokens_cost
            g.request_ids.append(b.request_id)
            if b.tokens_cost > g.example.tokens_cost:
                g.example = b
    ranked = sorted(groups.values(), key=lambda g: (-g.tokens_cost, g.key))
    return ranked[:top] if top is not None else ranked
