"""Why a request did not hit: the comparison of two prompts, the bounded records it needs,
and the one decision that names a reason (DESIGN.md, "prefix cache hit").

Torch-free and HTTP-free, so the engine, ``prefixcache analyze`` and the gateway share it
and one reason code means one thing everywhere:

- :func:`first_divergence`, :func:`reusable_tokens`: token ids of two prompts -> the first
  position where they differ, and the whole pages a hit could reuse (never the last token).
- :class:`DropLog`: per tenant, the recently dropped page hashes and why (evicted from the
  pool, the tenant quota, an expired pin or TTL), so "evicted" and "never seen" differ.
- :class:`ResponseLog`: per tenant, recent response ids -> what their prompts held, for
  ``compare_to`` and the best matching earlier request. A lookup names its tenant: another
  tenant's response is "not found", exactly like an unknown id.
- :func:`decide`: the facts -> one :data:`REASONS` code.

Both records are bounded (entries per tenant, tenants), so memory does not grow with the
requests served.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

# The reason codes, in the order :func:`decide` tries them.
REASONS = ("none", "prompt_logprobs", "shorter_than_one_page", "model_changed",
           "other_namespace", "prefix_changed", "evicted", "expired", "admission",
           "never_seen")
# Why a cached page was dropped -> (reason, detail); see :meth:`DropLog.record`.
DROP_CAUSES = {"pool": ("evicted", "pool"), "reset": ("evicted", "reset"),
               "quota": ("admission", "tenant_quota"), "pin": ("expired", "pin"),
               "ttl": ("expired", "ttl"), "session": ("expired", "session_closed")}


def first_divergence(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> int:
    """The first position where token ids ``a`` and ``b`` differ (their longest common
    prefix); ``min(len)`` when one is a prefix of the other."""
    n = min(len(a), len(b))
    neq = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(neq[0]) if len(neq) else n


def reusable_tokens(common: int, num_prompt_tokens: int, block_size: int) -> int:
    """Tokens a hit can reuse from a shared prefix of ``common`` tokens: whole pages, and
    never the prompt's last token (``cached_tokens <= prompt_tokens - 1``)."""
    return max(0, min(common, num_prompt_tokens - 1)) // block_size * block_size


@dataclass(frozen=True)
class Section:
    """A labelled span ``[start, end)`` of a prompt's text, in characters (``"system"``,
    ``"tools"``, ``"messages[2]"``, ``"messages[2].content[1]"``)."""

    label: str
    start: int
    end: int


def locate(sections: Sequence[Section], offset: int) -> str:
    """The label of the section holding character ``offset``: the innermost one containing
    it, else the template text after the last section starting before it (``"... +t"``),
    else ``"prompt"``."""
    inside = [s for s in sections if s.start <= offset < s.end]
    if inside:
        return min(inside, key=lambda s: s.end - s.start).label
    before = [s for s in sections if s.start <= offset]
    if before:
        return max(before, key=lambda s: (s.start, -s.end)).label + " +template"
    return "prompt"


def find_sections(text: str, anchors: Sequence[tuple[str, str]]) -> list[Section]:
    """Spans of ``anchors`` (label, content) in ``text``: each found at its first
    occurrence after the previous anchor (or anywhere when not found there); anchors not
    in the text are skipped (a template that drops or rewrites them)."""
    out, cursor = [], 0
    for label, content in anchors:
        if not content:
            continue
        at = text.find(content, cursor)
        if at < 0:
            at = text.find(content)
        if at < 0:
            continue
        out.append(Section(label, at, at + len(content)))
        cursor = at + len(content)
    return out


@dataclass(frozen=True)
class PromptRecord:
    """What a finished request leaves for later comparisons (same tenant only).

    ``token_ids``: its prompt followed by its output (decode pages publish too);
    ``num_prompt_tokens``; ``cache_salt``; ``model_key``: the model fingerprint and the
    extra keys (adapter) its pages were keyed under."""

    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    cache_salt: str | None
    model_key: Hashable
    array: np.ndarray = field(init=False, compare=False, repr=False)  # token_ids, int64

    def __post_init__(self) -> None:
        object.__setattr__(self, "array", np.asarray(self.token_ids, dtype=np.int64))


class _PerTenant:
    """Bounded ``tenant -> OrderedDict`` (least recently used tenant and entry go first)."""

    def __init__(self, per_tenant: int, max_tenants: int):
        if per_tenant < 1 or max_tenants < 1:
            raise ValueError("per_tenant and max_tenants must be >= 1")
        self.per_tenant, self.max_tenants = per_tenant, max_tenants
        self.tenants: OrderedDict[Hashable, OrderedDict] = OrderedDict()

    def put(self, tenant: Hashable, key: Hashable, value: object) -> None:
        d = self.tenants.get(tenant)
        if d is None:
            d = self.tenants[tenant] = OrderedDict()
            if len(self.tenants) > self.max_tenants:
                self.tenants.popitem(last=False)
        self.tenants.move_to_end(tenant)
        d[key] = value
        d.move_to_end(key)
        if len(d) > self.per_tenant:
            d.popitem(last=False)

    def get(self, tenant: Hashable, key: Hashable) -> object | None:
        d = self.tenants.get(tenant)
        return None if d is None else d.get(key)

    def pop(self, tenant: Hashable, key: Hashable) -> None:
        d = self.tenants.get(tenant)
        if d is not None:
            d.pop(key, None)

    def values(self, tenant: Hashable) -> list:
        d = self.tenants.get(tenant)
        return [] if d is None else list(d.items())

    def __len__(self) -> int:
        return sum(len(d) for d in self.tenants.values())


class DropLog:
    """Recently dropped page hashes per tenant and why (``cause``, a :data:`DROP_CAUSES`
    key). Bounded: ``per_tenant`` hashes per tenant, ``max_tenants`` tenants. A page
    published again is :meth:`forget`-ten, so a stale record never explains a miss."""

    def __init__(self, per_tenant: int = 4096, max_tenants: int = 1024):
        self._d = _PerTenant(per_tenant, max_tenants)
        self.recorded = 0  # drops recorded (one dict insert each)

    def record(self, tenant: Hashable, page_hash: bytes, cause: str) -> None:
        if cause not in DROP_CAUSES:
            raise ValueError(f"unknown drop cause {cause!r}")
        self._d.put(tenant, page_hash, cause)
        self.recorded += 1

    def forget(self, tenant: Hashable, page_hash: bytes) -> None:
        self._d.pop(tenant, page_hash)

    def cause(self, tenant: Hashable, page_hash: bytes) -> str | None:
        """Why the tenant's page ``page_hash`` was dropped, ``None`` if not recorded."""
        c = self._d.get(tenant, page_hash)
        return c if isinstance(c, str) else None

    def __len__(self) -> int:
        return len(self._d)


class ResponseLog:
    """Recent responses per tenant: id -> :class:`PromptRecord`. Bounded: ``per_tenant``
    responses per tenant, ``max_tenants`` tenants."""

    def __init__(self, per_tenant: int = 64, max_tenants: int = 1024):
        self._d = _PerTenant(per_tenant, max_tenants)

    def add(self, tenant: Hashable, response_id: str, record: PromptRecord) -> None:
        self._d.put(tenant, response_id, record)

    def get(self, tenant: Hashable, response_id: str) -> PromptRecord | None:
        """The tenant's response ``response_id``; ``None`` for an unknown id and for
        another tenant's (the same answer, by the same lookup)."""
        r = self._d.get(tenant, response_id)
        return r if isinstance(r, PromptRecord) else None

    def best(self, tenant: Hashable, token_ids: Sequence[int], min_common: int = 1,
             cache_salt: str | None = None) -> tuple[str, PromptRecord] | None:
        """The tenant's response sharing the longest prefix with ``token_ids`` (on ties:
        one under ``cache_salt``, then the most recent); ``None`` if none shares at least
        ``min_common`` tokens (a page: prompts that share only a BOS token or a template's
        first tokens are not related)."""
        best: tuple[tuple[int, bool], str, PromptRecord] | None = None
        query = np.asarray(token_ids, dtype=np.int64)
        for rid, rec in self._d.values(tenant):
            rank = (first_divergence(rec.array, query), rec.cache_salt == cache_salt)
            if rank[0] >= min_common and (best is None or rank >= best[0]):
                best = (rank, rid, rec)
        return None if best is None else (best[1], best[2])

    def __len__(self) -> int:
        return len(self._d)


@dataclass
class Facts:
    """What :func:`decide` needs, in tokens.

    ``hit_limit``: most tokens a hit could cover (whole pages before the last token);
    ``first_missed_drop``: the :data:`DROP_CAUSES` key recorded for the page after the hit.
    ``earlier``: the compared record, if any; ``common``: tokens it shares with the prompt.
    """

    num_prompt_tokens: int
    cached_tokens: int
    block_size: int
    read_cache: bool
    hit_limit: int
    cache_salt: str | None
    model_key: Hashable
    first_missed_drop: str | None = None
    earlier: PromptRecord | None = None
    common: int = 0


def decide(f: Facts) -> tuple[str, str | None]:
    """The reason code (one of :data:`REASONS`) and its detail (the tier or what expired;
    ``None`` when it has none). ``"none"``: the request reused all the cache could offer.

    Order: the request could not read the cache at all (prompt logprobs, shorter than a
    page); it read everything; the compared request differed in model or namespace; the
    page after the hit was dropped (and why); the compared prompt diverged there; else the
    page's tokens were never seen in this namespace."""
    if not f.read_cache:
        return "prompt_logprobs", None
    if f.num_prompt_tokens - 1 < f.block_size:
        return "shorter_than_one_page", None
    if f.cached_tokens >= f.hit_limit:
        return "none", None
    e = f.earlier
    if e is not None and e.model_key != f.model_key:
        return "model_changed", None
    if e is not None and e.cache_salt != f.cache_salt:
        return "other_namespace", "cache_salt"
    allowed = 0 if e is None else reusable_tokens(f.common, f.num_prompt_tokens, f.block_size)
    if f.first_missed_drop is not None and (e is None or f.cached_tokens < allowed):
        return DROP_CAUSES[f.first_missed_drop]
    if e is not None and f.cached_tokens < allowed:
        return "evicted", None  # dropped before the record began, or from a lower tier
    if e is not None and f.common < len(e.token_ids):
        return "prefix_changed", None
    return "never_seen", None
