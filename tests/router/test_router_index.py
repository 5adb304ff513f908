"""The router's page index and hashing: confirmed and approximate entries, dropping a
replica, the bound, and tenant isolation of the keys."""
from __future__ import annotations

import hashlib

import pytest

from prefixcache.cache.manager import KVCacheManager
from prefixcache.cache.page_keys import PromptKeys
from prefixcache.router.index import PageIndex

BS = 16


def _h(*parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


def test_match_counts_leading_pages_per_replica():
    idx = PageIndex()
    a, b, c = _h(1), _h(2), _h(3)
    idx.stored(0, [a, b, c])
    idx.stored(1, [a])
    assert idx.match([a, b, c], [0, 1, 2], now=0.0) == {0: 3, 1: 1, 2: 0}
    assert idx.match([b, c], [0, 1], now=0.0) == {0: 2, 1: 0}  # not leading for 1
    idx.removed(0, [b])
    assert idx.match([a, b, c], [0, 1], now=0.0) == {0: 1, 1: 1}
    idx.clear(0)
    assert idx.match([a, b, c], [0, 1], now=0.0) == {0: 0, 1: 1}
    idx.stored(0, [a])  # a new epoch starts empty and fills again
    assert idx.match([a], [0], now=0.0) == {0: 1}


def test_approximate_entries_expire_unless_confirmed():
    idx = PageIndex(approx_ttl_s=10.0)
    a, b = _h("a"), _h("b")
    idx.approximate(0, [a, b], now=100.0)
    assert idx.match([a, b], [0], now=109.0) == {0: 2}
    assert idx.match([a, b], [0], now=110.0) == {0: 0}
    idx.approximate(1, [a, b], now=100.0)
    idx.stored(1, [a])  # confirmed by an event: never expires
    idx.approximate(1, [a], now=200.0)  # and is not shortened by a later guess
    assert idx.match([a, b], [1], now=1e9) == {1: 1}


def test_index_stays_bounded_under_a_million_distinct_prompts():
    idx = PageIndex(max_pages=50_000)
    for i in range(1_000_000):
        idx.approximate(i % 4, [i.to_bytes(16, "big")], now=0.0)
    assert len(idx) == 50_000 and idx.evicted == 950_000
    newest = (999_999).to_bytes(16, "big")
    assert idx.match([newest], [3], now=0.0) == {3: 1}
    assert idx.match([(0).to_bytes(16, "big")], [0], now=0.0) == {0: 0}


def test_bad_bounds_name_the_parameter():
    with pytest.raises(ValueError, match="max_pages"):
        PageIndex(max_pages=0)
    with pytest.raises(ValueError, match="approx_ttl_s"):
        PageIndex(approx_ttl_s=0)


def test_router_hashes_are_the_engines_and_tenant_rooted():
    ids = list(range(7, 7 + 3 * BS + 5))
    keys = PromptKeys("builtin:tiny", "prefixcache/v1", BS)
    cache = KVCacheManager(16, BS, model_id="builtin:tiny", root_seed="prefixcache/v1")
    for tenant in (None, "alice"):
        pt = cache.new_page_table(f"r-{tenant}", ids, tenant=tenant)
        assert keys.page_hashes(ids, tenant, None) == cache.page_hashes(pt, 3)
    alice, bob = keys.page_hashes(ids, "alice", None), keys.page_hashes(ids, "bob", None)
    assert len(alice) == 3 and not set(alice) & set(bob)
    assert not set(alice) & set(keys.page_hashes(ids, "alice", "salt"))
    idx = PageIndex()
    idx.stored(0, alice)
    assert idx.match(bob, [0], now=0.0) == {0: 0}  # never a hit on another tenant's pages
    assert idx.match(alice, [0], now=0.0) == {0: 3}
