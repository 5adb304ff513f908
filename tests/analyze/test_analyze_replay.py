"""Exact hit counts of small token logs replayed through the cache core (block 4)."""
import pytest
from analyze_helpers import tokreq

from prefixcache.analyze.replay import pages_for_all, replay

R = list(range(1, 30))


def hits(reqs, **kw):
    return [c.cached_tokens for c in replay(reqs, block_size=4, **kw).calls]


def test_longest_whole_page_prefix():
    a = tokreq("a", R[:10])
    b = tokreq("b", R[:16])  # shares 10 tokens: 2 whole pages
    assert hits([a, b]) == [0, 8]


def test_last_prompt_token_is_never_a_hit():
    assert hits([tokreq("a", R[:8]), tokreq("b", R[:8])]) == [0, 4]


def test_response_pages_are_published():
    a = tokreq("a", R[:6], response=R[6:11])  # 6 + 5 - 1 = 10 tokens of KV: 2 pages
    b = tokreq("b", R[:14])
    assert hits([a, b]) == [0, 8]
    assert hits([a, b], publish_responses=False) == [0, 4]
    res = replay([a, b], block_size=4)
    assert [c.response_tokens_published for c in res.calls] == [4, 0]
    one = tokreq("a", R[:6], response=R[6:7])  # a single generated token: no KV written
    assert hits([one, b]) == [0, 4]


def test_tenants_never_share():
    assert hits([tokreq("a", R[:9], tenant="x"), tokreq("b", R[:9], tenant="y"),
                 tokreq("c", R[:9], tenant="x")]) == [0, 0, 8]


def test_capacity_evicts_least_recently_used_tail_first():
    a = tokreq("a", R[:8])
    b = tokreq("b", [50 + i for i in range(8)])
    c = tokreq("c", R[:9])
    # 3 pages: b needs 2, one is free, the other evicts a's tail page (freed first)
    res = replay([a, b, c], block_size=4, capacity_tokens=12)
    assert [x.cached_tokens for x in res.calls] == [0, 0, 4]
    assert res.stats["evictions"] >= 1
    assert hits([a, b, c]) == [0, 0, 8]


def test_request_larger_than_the_pool():
    res = replay([tokreq("a", R[:9])], block_size=4, capacity_tokens=4)
    assert not res.calls[0].fits and res.calls[0].cached_tokens == 0 and res.failed == 1
    with pytest.raises(ValueError):
        replay([tokreq("a", R[:9])], block_size=4, capacity_tokens=3)


def test_idle_ttl_expires_pages():
    a = tokreq("a", R[:8], ts=0.0)
    b = tokreq("b", R[:9], ts=100.0)
    assert hits([a, b], ttl_seconds=50) == [0, 0]
    assert hits([a, b], ttl_seconds=200) == [0, 8]
    res = replay([a, b], block_size=4, ttl_seconds=50)
    assert res.expired_pages == 2


def test_unlimited_pool_holds_every_token():
    reqs = [tokreq("a", R[:10], response=R[10:13]), tokreq("b", R[:3])]
    assert pages_for_all(reqs, 4) == 4 + 1
    res = replay(reqs, block_size=4)
    assert res.num_pages == 5 and res.stats["evictions"] == 0
    assert res.prompt_tokens == 13 and res.hit_rate == 0.0
