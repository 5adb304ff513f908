"""Layer 3: shape forwarded requests so that the upstream's own prefix cache hits.

Anthropic (a Messages body, changed in place by :func:`place_breakpoints`; a Messages
client's body is the one it sent, text blocks and breakpoints as they were): the client's
own breakpoints are kept, and the gateway adds its own in the free slots, at most 4 in
all, in the provider's order tools -> system -> messages:

1. the last tool (caches the tool list),
2. the last system block (tools + system),
3. the last block of the latest turn (a rolling breakpoint: next turn reads it),
4. when more than ``LOOKBACK_BLOCKS`` blocks precede the latest one, a block that many
   before it, so the previous turn's entry stays within the provider's lookback.

Each is placed only when the prefix it closes reaches the model's minimum cacheable
length (the price sheet's ``min_cacheable_tokens``; tokens estimated as characters / 4,
rounded up); below it the provider caches nothing and a breakpoint only wastes one of
the four. All get one TTL, from the expected reuse: ``"1h"`` when this prefix was last
seen more than 5 minutes ago (a 5-minute entry would have expired), else ``"5m"``.

OpenAI: ``prompt_cache_key`` = BLAKE2b-128 of the tenant and the stable prefix (system
prompt and tools), hex, so one tenant's requests with the same prefix are routed alike.
Our engine and vLLM: ``cache_salt`` from the tenant (:func:`tenant_salt`).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from prefixcache.analyze.pricing import PriceSheetError, load_sheet
from prefixcache.cache.hashing import blake2b_128, encode_parts

LOOKBACK_BLOCKS = 20
MAX_BREAKPOINTS = 4
DEFAULT_MIN_CACHEABLE = 1024
FIVE_MIN_S = 300.0


def estimate_tokens(text: str) -> int:
    """A provider-independent token estimate: characters / 4, rounded up."""
    return math.ceil(len(text) / 4)


@lru_cache(maxsize=1)
def _anthropic_minimums() -> dict[str, int]:
    try:
        sheet = load_sheet("anthropic")
    except (PriceSheetError, OSError):
        return {}
    return {name: int(m.get("min_cacheable_tokens", DEFAULT_MIN_CACHEABLE))
            for name, m in sheet["models"].items()}


def min_cacheable_tokens(model: str) -> int:
    """The model's minimum cacheable prefix (the longest sheet name ``model`` starts with;
    1024 for an unknown model)."""
    table = _anthropic_minimums()
    best = max((n for n in table if model.startswith(n)), key=len, default=None)
    return table[best] if best else DEFAULT_MIN_CACHEABLE


def _block_text(block: dict) -> str:
    if block.get("type") == "text":
        return str(block.get("text", ""))
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"},
                      sort_keys=True)


def place_breakpoints(msg: dict, ttl: str, min_tokens: int) -> list[str]:
    """Add the gateway's ``cache_control`` breakpoints to a Messages body; returns where
    they went (``"tools"``, ``"system"``, ``"lookback"``, ``"turn"``, in body order).

    The client's own breakpoints stay where they are, as sent: the gateway only adds, in
    the slots they leave (``"turn"`` first, then ``"system"``, ``"tools"``,
    ``"lookback"``), so its cache reads are never below those of the body as sent. An
    added breakpoint takes the TTL of the nearest client breakpoint before it (or of the
    first one, when it comes before them all): the provider wants 1 h entries before 5 m
    ones. A body with a top-level ``cache_control`` (the provider places that breakpoint
    itself) gets none.
    """
    if isinstance(msg.get("system"), str):
        msg["system"] = [{"type": "text", "text": msg["system"]}]
    for m in msg.get("messages", []):
        if isinstance(m.get("content"), str):
            m["content"] = [{"type": "text", "text": m["content"]}]
    tools = msg.get("tools") or []
    system = msg.get("system") or []
    blocks = [b for m in msg.get("messages", []) for b in m["content"]]
    seq = [*tools, *system, *blocks]
    own = [i for i, b in enumerate(seq) if b.get("cache_control")]
    budget = MAX_BREAKPOINTS - len(own)
    if msg.get("cache_control") is not None or budget <= 0:
        return []
    prefix = [0]  # estimated tokens up to and including seq[i], at prefix[i + 1]
    for b in seq:
        prefix.append(prefix[-1] + estimate_tokens(_block_text(b)))
    head, last = len(tools) + len(system), len(seq) - 1
    wanted = [("turn", last if blocks else -1), ("system", head - 1 if system else -1),
              ("tools", len(tools) - 1), ("lookback", last - LOOKBACK_BLOCKS)]
    chosen = [(where, i) for where, i in wanted
              if i >= 0 and (where != "lookback" or i >= head)
              and prefix[i + 1] >= min_tokens and i not in own][:budget]
    for _, i in chosen:
        before = [j for j in own if j < i]
        near = before[-1] if before else (own[0] if own else None)
        seq[i]["cache_control"] = {"type": "ephemeral", "ttl": ttl if near is None else
                                   seq[near]["cache_control"].get("ttl", "5m")}
    return [where for where, _ in sorted(chosen, key=lambda c: c[1])]


def prefix_material(body: dict) -> str:
    """The stable head of a chat body: its system messages and tools, as canonical JSON."""
    system = [m.get("content") for m in body.get("messages", [])
              if m.get("role") in ("system", "developer")]
    return json.dumps([system, body.get("tools")], sort_keys=True, separators=(",", ":"))


def prompt_cache_key(tenant: str | None, body: dict) -> str:
    """OpenAI's ``prompt_cache_key`` for a chat body: hex BLAKE2b-128."""
    return blake2b_128(encode_parts("prompt_cache_key", tenant, prefix_material(body))).hex()


class ReuseClock:
    """When each (tenant, prefix) was last seen, to choose a breakpoint TTL (at most
    ``max_entries`` remembered; the oldest are forgotten)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_entries: int = 100_000):
        self.clock = clock
        self.max_entries = max_entries
        self._seen: dict[bytes, float] = {}

    def ttl(self, tenant: str | None, body: dict) -> str:
        key = blake2b_128(encode_parts("reuse", tenant, prefix_material(body)))
        now = self.clock()
        last = self._seen.pop(key, None)
        self._seen[key] = now
        if len(self._seen) > self.max_entries:
            self._seen.pop(next(iter(self._seen)))
        return "1h" if last is not None and now - last > FIVE_MIN_S else "5m"


def tenant_salt(tenant: str, client_salt: Any) -> str:
    """The ``cache_salt`` sent to our engine (or vLLM): the gateway's tenant (and the
    client's own salt) hashed, so tenants behind one gateway key never share KV pages."""
    return blake2b_128(encode_parts("gateway-tenant", tenant, client_salt)).hex()
