"""The cache core: page pool, page hashes, prefix index and in-flight registry.

Knows nothing of torch models or HTTP. Modules: :mod:`.hashing` (chained page hashes),
:mod:`.page_keys` (a table's page bytes, extras and hashes), :mod:`.page_pool` (states,
ref counts, LRU), :mod:`.prefix_index` (hash -> verified page), :mod:`.inflight` (who
computes which page), :mod:`.page_table` (one request's pages), :mod:`.hits` (hits and
following), :mod:`.allocation` (pages for a step), :mod:`.publish` (publication),
:mod:`.manager` (the facade the engine calls), :mod:`.cached_queues` (eviction order),
:mod:`.pins` (TTL pins), :mod:`.quotas` (per-tenant quotas), :mod:`.expiry` (idle TTL),
:mod:`.driver` (requests through the core without a model, for replays),
:mod:`.invariants`.
"""
from prefixcache.cache.hashing import PageHasher, encode_parts
from prefixcache.cache.inflight import InflightRegistry
from prefixcache.cache.manager import KVCacheManager, ResetReport
from prefixcache.cache.page_pool import PagePool, PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex

__all__ = [
           "InflightRegistry",
           "KVCacheManager",
           "PageHasher",
           "PagePool",
           "PageState",
           "PageTable",
           "PrefixIndex",
           "ResetReport",
           "encode_parts",
]
