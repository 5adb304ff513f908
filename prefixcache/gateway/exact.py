"""Layer 1 keys: what makes two requests the same request.

The exact key hashes (BLAKE2b-128 over :func:`prefixcache.cache.hashing.encode_parts`)
the tenant, the endpoint kind and the canonical request body: upstream model, every
message in order (system prompt included), tools in order, response format and every
sampling parameter. Only fields that cannot change the answer are left out
(:data:`NOT_KEYED`). Requests arriving in the Messages wire format are translated to
Chat Completions first, so the same request in either format has the same key.

Equal values key alike (:func:`canonical_values`): a number by its value (``0.0`` is
``0``; ``true`` stays distinct from ``1``), and, for upstreams that read them the same
(:data:`TEXT_PART_PROVIDERS`), a message ``content`` made of exactly one plain text part
``[{"type": "text", "text": T}]`` is the string ``T``. Our engine and vLLM hand content
parts to the model's chat template, which may render them differently, so there the two
forms stay distinct.

The semantic scope (layer 2) is the same material minus the content of the last user
message; the semantic text is that content.
"""
from __future__ import annotations

import json
import math
from typing import Any

from prefixcache.cache.hashing import blake2b_128, encode_parts

# Fields that never change the answer: how it is delivered, or client bookkeeping.
NOT_KEYED = frozenset({"stream", "stream_options", "user", "metadata", "store"})
_VERSION = "gateway-exact/v1"
# Upstreams whose wire format defines one text part and the bare string as the same content.
TEXT_PART_PROVIDERS = frozenset({"openai", "anthropic"})


def canonical_values(value: Any) -> Any:
    """``value`` with every integral finite float as the equal int (bools untouched)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: canonical_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical_values(v) for v in value]
    return value


def _one_text_part(content: Any) -> Any:
    """``[{"type": "text", "text": T}]`` (nothing else in the part) as ``T``."""
    if (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)
            and set(content[0]) == {"type", "text"} and content[0]["type"] == "text"
            and isinstance(content[0]["text"], str)):
        return content[0]["text"]
    return content


def _text_parts_as_strings(body: dict) -> dict:
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return body
    return {**body, "messages": [
        {**m, "content": _one_text_part(m.get("content"))}
        if isinstance(m, dict) and "content" in m else m for m in msgs]}


def _canonical(body: dict) -> str:
    body = canonical_values(body)
    return json.dumps({k: v for k, v in body.items() if k not in NOT_KEYED
                       and not k.startswith("_")}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False)


def exact_key(tenant: str | None, kind: str, body: dict,
              provider: str | None = None) -> bytes:
    """The 16-byte layer-1 key of a ``kind`` ("chat" | "completions") body bound for a
    ``provider`` upstream (one text part is the string only for
    :data:`TEXT_PART_PROVIDERS`)."""
    if kind == "chat" and provider in TEXT_PART_PROVIDERS:
        body = _text_parts_as_strings(body)
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
