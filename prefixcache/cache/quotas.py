"""Per-tenant quotas: which cached-free page an allocation evicts (a noisy neighbour).

A tenant's *usage* is the pages it holds in the pool, live or cached-free (every
non-free page has one owner: pages are never shared across tenants). With a quota
(a share of the pool, in pages), the eviction victim for an allocation by tenant ``T``
is, in this order:

1. if ``T`` is at or over its quota: ``T``'s own least recently used cached-free page
   (unpinned first, then pinned);
2. the least recently used unpinned page of the tenants over their quota;
3. the least recently used unpinned page of anyone;
4. the same two steps for pinned pages (pinned pages are evicted last).

Free pages are always used first (the pool is work-conserving), so a tenant may hold
more than its quota while nobody else needs the room; it then gives its own pages back
first. A flooding tenant at its quota therefore recycles its own pages and cannot evict
another tenant's cached pages, unless all of the flooder's pages are live (held by its
running requests): quotas choose eviction victims, they do not cap admission.
Without any quota the order is the plain pool order (unpinned LRU, then pinned LRU).
"""
from __future__ import annotations

from collections.abc import Hashable

from prefixcache.cache.page_pool import PagePool


class TenantQuotas:
    """Quota of each tenant, as a share of a pool of ``num_pages`` pages.

    Args:
        num_pages: pool size (pages).
        default_fraction: the quota of every tenant not in ``fractions``; ``None`` for
            no quota.
        fractions: per-tenant quotas (tenant -> share in ``(0, 1]``).

    Raises:
        ValueError: a share outside ``(0, 1]`` (names the tenant).
    """

    def __init__(self, num_pages: int, default_fraction: float | None = None,
                 fractions: dict[Hashable, float] | None = None):
        self.num_pages = num_pages
        for name, f in [("tenant_quota_fraction", default_fraction)] + [
                (f"quota of tenant {t!r}", f) for t, f in (fractions or {}).items()]:
            if f is not None and not 0.0 < f <= 1.0:
                raise ValueError(f"{name} must be in (0, 1], got {f}")
        self.default_fraction = default_fraction
        self.fractions = dict(fractions or {})

    @property
    def enabled(self) -> bool:
        return self.default_fraction is not None or bool(self.fractions)

    def limit(self, tenant: Hashable) -> int | None:
        """The tenant's quota in pages (at least 1), ``None`` without a quota."""
        f = self.fractions.get(tenant, self.default_fraction)
        return None if f is None else max(1, int(f * self.num_pages))

    def over_quota(self, pool: PagePool) -> list[Hashable]:
        """Tenants holding more pages than their quota."""
        out = []
        for tenant, used in pool.usage.items():
            q = self.limit(tenant)
            if q is not None and used > q:
                out.append(tenant)
        return out

    def victim(self, pool: PagePool, tenant: Hashable) -> int | None:
        """The cached-free page an allocation by ``tenant`` evicts (see the module
        docstring); ``None`` if no page is cached-free."""
        if not self.enabled:
            return pool.oldest_cached()
        q, queues = self.limit(tenant), pool.queues
        if q is not None and pool.usage[tenant] >= q:
            for pinned in (False, True):
                page = queues.oldest(pinned, tenant)
                if page is not None:
                    return page
        over = self.over_quota(pool)
        for pinned in (False, True):
            page = queues.oldest_of(over, pinned)
            if page is None:
                page = queues.oldest(pinned)
            if page is not None:
                return page
        return None
