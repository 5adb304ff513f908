"""TTL pins across the KV tiers (builtin:tiny, CPU): a pinned prefix evicted from the pool
is demoted to host RAM or disk (the pin stays and lists that tier), is evicted there only
after every unpinned page and within the tier's pin cap, reloads equal to a cold run and
re-pins in the pool; unpin and expiry release the tier pins."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.outputs import same_output as same
from prefixcache import LLM, SamplingParams

BS = 16
PAGE = 2 * 4 * BS * 4 * 32 * 4  # bytes of one page of builtin:tiny (float32)
G = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, logprobs=3)
FLOOD = 190  # tokens: 11 full pages + the rest, so a flood request needs the whole pool


def ids(k: int, n: int) -> list[int]:
    return [(1000 * k + 7 * t) % 260 + 3 for t in range(n)]


PREFIX = ids(0, 4 * BS)
DOC = PREFIX + [5, 6, 7]


def run(llm: LLM, prompt: list[int], tenant: str = "a"):
    out = llm.generate({"prompt_token_ids": prompt}, G, tenant=tenant)[0]
    if llm.engine.tiers is not None:
        llm.engine.tiers.flush()
    return out


@pytest.fixture(scope="module")
def cold():
    return run(LLM("builtin:tiny", num_pages=64, enable_prefix_caching=False), DOC)


def make(**kw) -> LLM:
    kw.setdefault("tier_load_policy", "always")
    return LLM("builtin:tiny", num_pages=12, block_size=BS, max_model_len=256, **kw)


def stat(llm: LLM, *names: str) -> tuple:
    s = llm.stats()
    return tuple(s[n] for n in names)


def flood(llm: LLM, ks) -> None:
    for k in ks:
        run(llm, ids(k, FLOOD), tenant="b")


def test_pinned_prefix_is_demoted_to_host_kept_last_and_reloads_equal_cold(cold):
    llm = make(host_cache_bytes=16 * PAGE)  # host pin cap: 8 pages
    pin = llm.pin_prefix({"prompt_token_ids": PREFIX}, ttl_s=300, tenant="a")
    flood(llm, [1])  # needs all 12 pages: the 4 pinned ones are evicted, hence demoted
    assert stat(llm, "pins", "pages_pinned", "pin_pages_in_tiers", "pin_pages_demoted") == (
        1, 0, 4, 4)
    assert [p["tier"] for p in llm.list_pins("a")] == ["host"] and llm.list_pins("b") == []
    assert stat(llm, "host_tier_pinned_entries", "host_tier_pinned_bytes") == (4, 4 * PAGE)
    flood(llm, [2, 3, 4])  # 33 unpinned pages through a 16-page tier holding 4 pinned
    assert stat(llm, "host_tier_pages", "host_tier_evictions", "host_tier_pinned_evictions"
                ) == (16, 33 - 12, 0)
    out = run(llm, DOC)
    same(out, cold)
    assert out.num_cached_tokens == 4 * BS
    assert stat(llm, "host_tier_hit_tokens", "pages_pinned", "pin_pages_in_tiers",
                "pin_pages_reloaded") == (4 * BS, 4, 0, 4)
    listed = llm.list_pins("a")
    assert [(p["tier"], p["expires_at"]) for p in listed] == [("pool", pin["expires_at"])]
    assert llm.unpin(pin["prefix_hash"], tenant="a")
    assert stat(llm, "pins", "pages_pinned", "host_tier_pinned_entries") == (0, 0, 0)


def test_without_a_pin_the_flood_evicts_the_prefix_from_host():
    llm = make(host_cache_bytes=16 * PAGE)
    run(llm, PREFIX)
    flood(llm, [1, 2, 3, 4])
    assert run(llm, DOC).num_cached_tokens == 0
    assert stat(llm, "host_tier_hit_tokens", "host_tier_pinned_entries") == (0, 0)


def test_unpin_then_flood_removes_the_prefix_from_host():
    llm = make(host_cache_bytes=16 * PAGE)
    pin = llm.pin_prefix({"prompt_token_ids": PREFIX}, ttl_s=300, tenant="a")
    flood(llm, [1])
    assert llm.unpin(pin["prefix_hash"], tenant="b") is False  # never another tenant's
    assert stat(llm, "host_tier_pinned_entries") == (4,)
    assert llm.unpin(pin["prefix_hash"], tenant="a") is True
    assert stat(llm, "pins", "pin_pages_in_tiers", "host_tier_pinned_entries",
                "host_tier_pinned_bytes") == (0, 0, 0, 0)
    assert llm.engine.tiers is not None
    assert all(not t.pins.wanted for t in llm.engine.tiers.local)
    flood(llm, [2, 3, 4])
    assert llm.list_pins("a") == []
    assert run(llm, DOC).num_cached_tokens == 0


def test_expiry_releases_the_tier_pin():
    llm = make(host_cache_bytes=16 * PAGE)
    now = [1000.0]
    llm.engine.cache.pins.clock = lambda: now[0]
    llm.pin_prefix({"prompt_token_ids": PREFIX}, ttl_s=60, tenant="a")
    flood(llm, [1])
    assert [p["tier"] for p in llm.list_pins("a")] == ["host"]
    now[0] += 61
    flood(llm, [2])  # the write-back collects expired pins before storing
    assert stat(llm, "pins", "pins_expired", "pin_pages_in_tiers",
                "host_tier_pinned_entries") == (0, 1, 0, 0)
    flood(llm, [3, 4])
    assert run(llm, DOC).num_cached_tokens == 0 and llm.list_pins("a") == []


def test_pinned_bytes_in_the_host_tier_stay_under_its_cap():
    llm = make(host_cache_bytes=8 * PAGE)  # pin cap: 4 pages of host RAM, 6 of the pool
    llm.pin_prefix({"prompt_token_ids": ids(0, 6 * BS)}, ttl_s=300, tenant="a")
    flood(llm, [1])  # evicts the 6 pinned pages: 4 are pinned in host, 2 are ordinary
    assert stat(llm, "pin_pages_in_tiers", "host_tier_pages", "host_tier_pinned_entries",
                "host_tier_pinned_bytes") == (6, 6, 4, 4 * PAGE)
    assert [p["tier"] for p in llm.list_pins("a")] == ["host"]


def test_a_pin_whose_page_left_every_tier_lapses_when_listed():
    llm = make(host_cache_bytes=10 * PAGE)  # pin cap: 5 pages of host RAM, 6 of the pool
    llm.pin_prefix({"prompt_token_ids": ids(0, 6 * BS)}, ttl_s=300, tenant="a")
    flood(llm, [1])  # 5 pinned pages in host RAM, the 6th ordinary (over the cap)
    assert stat(llm, "host_tier_pages", "host_tier_pinned_entries") == (6, 5)
    for k in (2, 3):  # 3 pages each: the oldest ordinary page (the pin's 6th) goes first
        run(llm, ids(k, 3 * BS + 2), tenant="b")
    assert stat(llm, "host_tier_pinned_evictions", "host_tier_pinned_entries") == (0, 5)
    assert llm.list_pins("a") == []
    assert stat(llm, "pins", "pins_evicted", "pin_pages_in_tiers",
                "host_tier_pinned_entries") == (0, 1, 0, 0)


def test_pinned_prefix_is_demoted_to_disk(cold, tmp_path: Path):
    llm = make(disk_cache_dir=str(tmp_path), disk_cache_bytes=1 << 24)
    llm.pin_prefix({"prompt_token_ids": PREFIX}, ttl_s=300, tenant="a")
    flood(llm, [1])
    assert [p["tier"] for p in llm.list_pins("a")] == ["disk"]
    assert stat(llm, "disk_tier_pinned_entries") == (1,)  # one file: the 4 pinned pages
    out = run(llm, DOC)
    same(out, cold)
    assert (out.num_cached_tokens, llm.stats()["disk_tier_hit_tokens"]) == (4 * BS, 4 * BS)
    assert [p["tier"] for p in llm.list_pins("a")] == ["pool"]


def test_without_tiers_an_evicted_pin_lapses():
    llm = make()
    llm.pin_prefix({"prompt_token_ids": PREFIX}, ttl_s=300, tenant="a")
    flood(llm, [1])
    assert stat(llm, "pins", "pins_evicted", "pin_pages_demoted") == (0, 1, 0)
    assert llm.list_pins("a") == []
