"""The cache core: page pool, page hashes, prefix index and in-flight registry.

Knows nothing of torch models or HTTP. Modules: :mod:`.hashing` (chained page hashes),
:mod:`.page_pool` (states, ref counts, LRU), :mod:`.prefix_index` (hash -> verified page),
:mod:`.inflight` (who computes which page, who waits), :mod:`.page_table` (one request's
pages), :mod:`.manager` (the operations the engine calls), :mod:`.invariants`.
"""
from prefixcache.cache.hashing import PageHasher, encode_parts
from prefixcache.cache.inflight import InflightRegistry, Wakeup
from prefixcache.cache.manager import KVCacheManager, ResetReport
from prefixcache.cache.page_pool import PagePool, PageState
from prefixcache.cache.page_table import PageTable
from prefixcache.cache.prefix_index import PrefixIndex

__all__ = ["KVCacheManager", "PageHasher", "PagePool", "PageState", "PageTable",
           "PrefixIndex", "InflightRegistry", "ResetReport", "Wakeup", "encode_parts"]
