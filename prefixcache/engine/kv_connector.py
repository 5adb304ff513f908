"""The engine's KV connector: the tiers and the shared store behind one object.

:func:`build_connector` reads ``EngineConfig`` once and returns the connector the cache
manager is built with (``cache/connector.py`` has the interface and the table of who
calls what): :class:`~prefixcache.cache.connector.NullConnector` when no tier is
configured (or prefix caching is off), else a :class:`TieredConnector` over

- :class:`~.kv_tiers.KVTiers`: the host-RAM (L2) and disk (L3) tiers, write-back or
  write-through, and the lookups and loads of every tier, the shared one included;
- :class:`~.kv_store.SharedKVStore` (with ``kv_store_url``): the shared Redis tier (L4),
  stored at publication, and the cross-replica stampede lock.

Adding a tier: implement :class:`~prefixcache.cache.tiers.base.Tier` (bytes in, bytes
out, verified on read) in ``cache/tiers/`` and build it here, as the other tiers are.
"""
from __future__ import annotations

import logging

from prefixcache.cache.allocation import EvictedPage
from prefixcache.cache.connector import KVConnector, NullConnector
from prefixcache.cache.events import CacheEvent
from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.tiers.redis_store import RedisTier
from prefixcache.config import EngineConfig
from prefixcache.engine.kv_store import SharedKVStore
from prefixcache.engine.kv_tiers import KVTiers
from prefixcache.model.kv_pool import KVPool

log = logging.getLogger(__name__)


def build_connector(config: EngineConfig, kv: KVPool, fingerprint: str) -> KVConnector:
    """The connector of an engine with ``config`` over the pool ``kv``.

    Args:
        config: reads ``enable_prefix_caching``, the tier fields (``host_cache_bytes``,
            ``disk_cache_dir``, ``disk_cache_bytes``, ``tier_*``, ``max_pinned_fraction``)
            and the shared store's (``kv_store_url``, ``kv_store_ttl_s``,
            ``kv_store_timeout_s``, ``kv_store_lock_wait_s``).
        kv: the KV pool whose pages the tiers copy.
        fingerprint: :func:`~prefixcache.cache.identity.model_fingerprint`.

    Raises:
        ValueError / OSError: as :class:`~.kv_tiers.KVTiers` (a budget under one page, a
            disk directory that cannot be used) and :class:`RedisTier` (a bad URL).
    """
    if not config.enable_prefix_caching or not (
            config.host_cache_bytes or config.disk_cache_dir or config.kv_store_url):
        log.info("KV tiers: off (no host RAM, disk or shared store tier configured)")
        return NullConnector()
    tiers = KVTiers(config, kv, fingerprint)
    shared = None
    if config.kv_store_url:
        remote = RedisTier(config.kv_store_url, tiers.fingerprint,
                           ttl_s=config.kv_store_ttl_s, timeout_s=config.kv_store_timeout_s,
                           layout=tiers.layout)
        tiers.add_remote(remote)
        shared = SharedKVStore(config, kv, remote, tiers.estimates)
    return TieredConnector(tiers, shared)


class TieredConnector(KVConnector):
    """The host/disk tiers and, optionally, the shared store, as one connector.

    Args:
        tiers: the tiers (lookups and loads of every tier, write-back of the local ones).
        shared: the shared store (publication-time stores, the stampede lock), or
            ``None``.
    """

    def __init__(self, tiers: KVTiers, shared: SharedKVStore | None = None):
        self.tiers, self.shared = tiers, shared
        self.writes_back = tiers.writes_back
        self.records_events = shared is not None
        self._cache: KVCacheManager | None = None

    def bind(self, cache: KVCacheManager) -> None:
        if self._cache is not None and self._cache is not cache:
            raise ValueError("connector: already bound to another KVCacheManager")
        self._cache = cache
        self.tiers.bind(cache)
        if self.shared is not None:
            self.shared.bind(cache)

    # -- lookups and loads -------------------------------------------------------------
    def should_wait(self, pt: PageTable) -> bool:
        return self.shared is not None and not self.closed and self.shared.should_wait(pt)

    def load(self, pt: PageTable) -> int:
        return 0 if self.closed else self.tiers.extend_hit(pt)

    def tier_of(self, hashes: list[bytes]) -> str | None:
        return self.tiers.tier_of(hashes)

    # -- stores ------------------------------------------------------------------------
    def on_evict(self, evicted: list[EvictedPage]) -> None:
        if not self.closed:
            self.tiers.write_back(evicted)

    def on_pinned(self, hashes: list[bytes], pinned: bool) -> None:
        self.tiers.set_pinned(hashes, pinned)

    def on_published(self, events: list[CacheEvent]) -> None:
        if self.shared is not None and events and not self.closed:
            self.shared.publish(events)

    def on_finished(self, request_id: str) -> None:
        if self.shared is not None:
            self.shared.forget(request_id)

    def observe_prefill(self, seconds: float, tokens: int) -> None:
        self.tiers.estimates.observe_prefill(seconds, tokens)

    # -- state and shutdown ------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return 0 if self.shared is None else self.shared.waiting

    @property
    def closed(self) -> bool:
        return self.tiers.closed

    def flush(self) -> None:
        self.tiers.flush()
        if self.shared is not None:
            self.shared.queue.flush()

    def close(self) -> None:
        """Stop the shared store's worker first (it writes through the Redis client the
        tiers close), then write the pool's cached pages down to the local tiers and
        finish their queued stores."""
        if self.closed:
            return
        if self.shared is not None:
            self.shared.close()
        self.tiers.close()

    def stats(self) -> dict[str, int | float]:
        d = self.tiers.stats()
        if self.shared is not None:
            d.update(self.shared.stats())
        return d
