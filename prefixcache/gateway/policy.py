"""Per-tenant cache settings (``--tenant-policy FILE``)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TenantPolicy:
    """A tenant's cache settings (``--tenant-policy FILE``: ``{tenant: {...}}``, ``"*"``
    for the default)."""

    cache_ttl_s: float = 3600.0
    cache_sampled: bool = False
    semantic: bool = False
    store_finish_reasons: tuple[str, ...] = ("stop", "length")
