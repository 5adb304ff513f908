"""Layer 1 keys: what makes two requests the same request.

The exact key hashes (BLAKE2b-128 over :func:`prefixcache.cache.hashing.encode_parts`)
the tenant, the endpoint kind and the canonical request body: upstream model, every
message in order (system prompt included), tools in order, response format and every
sampling parameter. Only fields that cannot change the answer are left out
(:data:`NOT_KEYED`). Requests arriving in the Messages wire format are translated to
Chat Completions first, so the same request in either format has the same key.

The semantic scope (layer 2) is the same material minus the content of the last user
message; the semantic text is that content.
"""
from __future__ import annotations

import json

from prefixcache.cache.hashing import blake2b_128, encode_parts

# Fields that never change the answer: how it is delivered, or client bookkeeping.
NOT_KEYED = frozenset({"stream", "stream_options", "user", "metadata", "store"})
_VERSION = "gateway-exact/v1"


def _canonical(body: dict) -> str:
    return json.dumps({k: v for k, v in body.items() if k not in NOT_KEYED
                       and not k.startswith("_")}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def exact_key(tenant: str | None, kind: str, body: dict) -> bytes:
    """The 16-byte layer-1 key of a ``kind`` ("chat" | "completions") body."""
    return blake2b_128(encode_parts(_VERSION, tenant, kind, _canonical(body)))


def semantic_scope(tenant: str | None, body: dict) -> tuple[bytes, str] | None:
    """``(scope, text)`` of a chat body whose last message is a user's text; else
    ``None`` (layer 2 does not apply)."""
    msgs = body.get("messages") or []
    if not msgs or msgs[-1].get("role") != "user" or not isinstance(msgs[-1].get("content"),
                                                                   str):
        return None
    head = {**body, "messages": [*msgs[:-1], {**msgs[-1], "content": None}]}
    scope = blake2b_128(encode_parts(_VERSION, "scope", tenant, _canonical(head)))
    return scope, msgs[-1]["content"]


def is_sampled(body: dict) -> bool:
    """Whether the answer is drawn at random: temperature > 0 (the providers' default
    temperature is 1, so an unset one counts as sampled) or n > 1."""
    t = body.get("temperature")
    return (t is None or t > 0) or (body.get("n") or 1) > 1
