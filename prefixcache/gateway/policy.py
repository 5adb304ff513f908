"""Per-tenant cache settings (``--tenant-policy FILE``) and their strict parsing.

The file is one JSON object ``{tenant: {field: value}}``, ``"*"`` for every other tenant.
Every field is optional; its value must have exactly the JSON type below (a string
``"false"`` is not a boolean, ``1`` is not ``true``), and unknown fields are refused:

- ``cache_ttl_s``: a finite number > 0 (default 3600)
- ``cache_sampled``: ``true`` / ``false`` (default ``false``)
- ``semantic``: ``true`` / ``false`` (default ``false``)
- ``store_finish_reasons``: a list drawn from :data:`FINISH_REASONS`
  (default ``["stop", "length"]``)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter")


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's cache settings (``--tenant-policy FILE``: ``{tenant: {...}}``, ``"*"``
    for the default)."""

    cache_ttl_s: float = 3600.0
    cache_sampled: bool = False
    semantic: bool = False
    store_finish_reasons: tuple[str, ...] = ("stop", "length")


POLICY_FIELDS = ("cache_ttl_s", "cache_sampled", "semantic", "store_finish_reasons")


def _ttl(value: Any) -> float | str:
    """The TTL, or the problem with it."""
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not (math.isfinite(value) and value > 0)):
        return "must be a finite number > 0"
    return float(value)


def _reasons(value: Any) -> tuple[str, ...] | str:
    """The finish reasons, or the problem with them."""
    if not isinstance(value, list) or not all(
            isinstance(r, str) and r in FINISH_REASONS for r in value):
        return f"must be a list drawn from {', '.join(FINISH_REASONS)}"
    return tuple(dict.fromkeys(value))


def parse_policy(tenant: str, entry: Any) -> TenantPolicy:
    """One tenant's entry. Raises ValueError ``"TENANT.FIELD: problem"``."""
    if not isinstance(entry, dict):
        raise ValueError(f"{tenant}: must be an object {{field: value}}")
    unknown = sorted(set(entry) - set(POLICY_FIELDS))
    if unknown:
        raise ValueError(f"{tenant}.{unknown[0]}: unknown field (known: "
                         f"{', '.join(POLICY_FIELDS)})")
    kw: dict[str, Any] = {}
    for field, value in entry.items():
        if field == "cache_ttl_s":
            got: Any = _ttl(value)
        elif field == "store_finish_reasons":
            got = _reasons(value)
        else:
            got = value if isinstance(value, bool) else "must be true or false"
        if isinstance(got, str):
            raise ValueError(f"{tenant}.{field}: {got}")
        kw[field] = got
    return TenantPolicy(**kw)


def parse_policies(data: Any) -> dict[str, TenantPolicy]:
    """A whole ``--tenant-policy`` document. Raises ValueError naming tenant and field."""
    if not isinstance(data, dict):
        raise ValueError("must hold a JSON object {tenant: {...}}")
    return {tenant: parse_policy(tenant, entry) for tenant, entry in data.items()}
