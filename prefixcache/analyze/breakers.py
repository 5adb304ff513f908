"""Cache breakers: places where prompts that share most of their text diverge early.

For each request B, a few earlier requests A of the same namespace (tenant and
cache salt; other namespaces never share pages) are compared with it: the previous
request of B's conversation, the previous request of the namespace, and the one among
the last ``lookback`` with the longest common prefix. A stands for what it published:
its prompt, then its recorded response (the engine publishes decode pages). For a pair:

1. ``d`` = their longest common token prefix: the **divergence** token index.
2. Re-alignment: the smallest ``j`` (then ``i``) such that ``A[d+i:]`` and ``B[d+j:]``
   share at least ``min_shared`` leading tokens (``m`` of them, the **shared-after**
   run), searched within ``window`` tokens of ``d``. ``B[d:d+j]`` is B's divergent span
   (a timestamp, an id).
   The run must also cover at least half of the shorter of the two remainders
   (``m >= min_fraction * min(len(A) - d - i, len(B) - d - j)``): the pair shares most
   of its text after the divergence, not just some boilerplate.
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
from numpy.lib.stride_tricks import sliding_window_view

from prefixcache.analyze.records import TokenizedRequest
from prefixcache.analyze.textmap import prompt_context
from prefixcache.cache.miss_diagnosis import first_divergence, reusable_tokens

WINDOW_TOKENS = 2048
MIN_SHARED_TOKENS = 32
MIN_SHARED_FRACTION = 0.5
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


# The engine's miss diagnosis compares prompts with the same function, so a divergence
# found here is the one a request's diagnosis reports.
lcp = first_divergence


_MULT = np.random.default_rng(0x5EED).integers(1, 2**63, size=4096, dtype=np.uint64) | 1


def _grams(x: np.ndarray, start: int, last: int, k: int) -> np.ndarray:
    """64-bit hashes of ``x[p:p+k]`` for ``p`` in ``[start, last]``."""
    win = sliding_window_view(x[start:last + k].astype(np.uint64), k)
    with np.errstate(over="ignore"):
        return (win * _MULT[:k]).sum(axis=1, dtype=np.uint64)


def realign(a: np.ndarray, b: np.ndarray, d: int, *, window: int = WINDOW_TOKENS,
            min_shared: int = MIN_SHARED_TOKENS) -> tuple[int, int, int] | None:
    """``(i, j, m)``: ``A[d+i:]`` and ``B[d+j:]`` share ``m >= min_shared`` leading
    tokens, ``j`` smallest, then ``i`` (see the module docstring); ``None`` if there is
    no such place within ``window`` tokens of ``d``. Candidate places are found by
    hashing every ``min_shared``-token run of both windows, then checked token by token.
    """
    k = min(min_shared, len(_MULT))
    a_last = min(len(a) - k, d + window)
    b_last = min(len(b) - k, d + window)
    if a_last < d or b_last < d or k < 1:
        return None
    ha = _grams(a, d, a_last, k)
    hb = _grams(b, d, b_last, k)
    for q in np.flatnonzero(np.isin(hb, ha)):
        for p in np.flatnonzero(ha == hb[q]):
            m = lcp(a[d + p:], b[d + q:])
            if m >= min_shared:
                return int(p), int(q), m
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


def _pair(a: np.ndarray, b: np.ndarray, hit_b: int, bs: int, *, window: int,
          min_shared: int, min_fraction: float) -> tuple[int, int, int, int, int] | None:
    d = lcp(a, b)
    if d >= len(a) - min_shared or d >= len(b) - 1:
        return None
    found = realign(a, b, d, window=window, min_shared=min_shared)
    if found is None:
        return None
    i, j, m = found
    if m < min_fraction * min(len(a) - d - i, len(b) - d - j):
        return None
    would = reusable_tokens(d + j + m, len(b), bs)
    cost = would - max(d // bs * bs, hit_b)
    if cost < bs:
        return None
    return d, i, j, m, cost


def find_breakers(requests: list[TokenizedRequest], hits: list[int], block_size: int,
                  tokenizer=None, *, publish_responses: bool = True,
                  lookback: int = LOOKBACK, window: int = WINDOW_TOKENS,
                  min_shared: int = MIN_SHARED_TOKENS,
                  min_fraction: float = MIN_SHARED_FRACTION
                  ) -> list[Breaker]:
    """One :class:`Breaker` per request that has one (its costliest pair).

    Args:
        hits: each request's replayed cached tokens (same order).
        tokenizer: for the text around the divergence (omitted: no text).
        publish_responses: as in the replay (a partner offers its response too).
    """
    pub: dict[int, np.ndarray] = {}  # partners still in reach, as published

    def published(n: int) -> np.ndarray:
        # what a partner offers: its prompt, then its response but the last token
        # (whose KV is never written)
        if n not in pub:
            r = requests[n]
            ids = r.prompt_ids + r.response_ids[:-1] if publish_responses else r.prompt_ids
            pub[n] = np.asarray(ids, dtype=np.int64)
        return pub[n]

    by_ns: dict[tuple, list[int]] = {}
    last_in_conv: dict[tuple, int] = {}
    conv_lasts: set[int] = set()
    out: list[Breaker] = []
    for k, r in enumerate(requests):
        b = np.asarray(r.prompt_ids, dtype=np.int64)
        ns = (r.request.tenant, r.request.cache_salt)
        recent = by_ns.setdefault(ns, [])
        cands: list[int] = []
        conv = r.request.conversation
        if conv is not None and (ns, conv) in last_in_conv:
            cands.append(last_in_conv[(ns, conv)])
        if recent:
            cands.append(recent[-1])
            cands.append(max(recent, key=lambda x: lcp(published(x), b)))
        best_pair = None
        for a in dict.fromkeys(cands):
            got = _pair(published(a), b, hits[k], block_size, window=window,
                        min_shared=min_shared, min_fraction=min_fraction)
            if got and (best_pair is None or got[4] > best_pair[1][4]):
                best_pair = (a, got)
        if best_pair is not None:
            a, (d, i, j, m, cost) = best_pair
            out.append(_describe(requests[a], r, d, i, j, m, cost, tokenizer))
        recent.append(k)
        if conv is not None:
            old = last_in_conv.get((ns, conv))
            last_in_conv[(ns, conv)] = k
            conv_lasts.add(k)
            if old is not None:
                conv_lasts.discard(old)
                if old not in recent:
                    pub.pop(old, None)
        if len(recent) > lookback:
            gone = recent.pop(0)
            if gone not in conv_lasts:
                pub.pop(gone, None)
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
