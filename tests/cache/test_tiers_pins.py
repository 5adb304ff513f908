"""Pins inside the host-RAM and disk tiers: pinned entries are evicted only after every
unpinned one, within ``max_pinned_fraction`` of the budget, and unpinning releases them."""
from __future__ import annotations

from pathlib import Path

import pytest

from prefixcache.cache.tiers.disk_tier import DiskTier
from prefixcache.cache.tiers.format import PageGroup, encode
from prefixcache.cache.tiers.host_tier import HostTier
from prefixcache.cache.tiers.tier_pins import TierPins

FP = b"fp"
SHAPE = (2, 2, 4)  # 64 bytes per page


def grp(*ids: int) -> PageGroup:
    return PageGroup(FP, tuple(h(i) for i in ids), tuple((i, i + 1) for i in ids), "float32",
                     SHAPE, b"".join(bytes([i]) * 64 for i in ids))


def h(i: int) -> bytes:
    return bytes([i]) * 16


def held(t, ids) -> list[int]:
    return [i for i in ids if t.contains(h(i))]


def test_host_pinned_pages_are_evicted_after_every_unpinned_one() -> None:
    t = HostTier(6 * 64, max_pinned_fraction=0.5)  # 6 pages, 3 pinned at most
    t.set_pinned([h(1), h(2)], True)  # before they are stored: admitted when they arrive
    for i in range(1, 7):
        t.put(grp(i))
    s = t.stats()
    assert (s.pinned_entries, s.pinned_bytes, s.pages) == (2, 128, 6)
    for i in range(7, 11):  # four more: the four oldest unpinned (3..6) go, not 1 and 2
        t.put(grp(i))
    assert held(t, range(1, 11)) == [1, 2, 7, 8, 9, 10]
    assert (t.stats().evictions, t.stats().pinned_evictions) == (4, 0)
    t.put(grp(11, 12, 13, 14, 15))  # five pages: only the pinned ones are left to evict
    assert held(t, range(1, 16)) == [2, 11, 12, 13, 14, 15]
    assert (t.stats().pinned_evictions, t.stats().pinned_entries) == (1, 1)


def test_host_pins_over_the_cap_are_ordinary_and_unpin_releases() -> None:
    t = HostTier(8 * 64, max_pinned_fraction=0.25)  # cap: 2 pages
    t.set_pinned([h(i) for i in (1, 2, 3)], True)
    t.put(grp(1, 2, 3))
    assert (t.stats().pinned_entries, t.stats().pinned_bytes) == (2, 128)
    for i in range(4, 10):  # 6 more pages: 3 (over the cap) goes first, as the oldest
        t.put(grp(i))
        assert t.stats().pinned_bytes <= t.pins.cap_bytes
    assert held(t, (1, 2, 3)) == [1, 2]
    t.set_pinned([h(1), h(2), h(3)], False)
    assert (t.stats().pinned_entries, t.stats().pinned_bytes, len(t.pins.wanted)) == (0, 0, 0)
    for i in range(10, 12):  # now they are the oldest: evicted first
        t.put(grp(i))
    assert held(t, (1, 2)) == []


def test_disk_pinned_files_go_last_and_unpin_releases(tmp_path: Path) -> None:
    size = len(encode(grp(1)))
    t = DiskTier(tmp_path, 4 * size, FP, max_pinned_fraction=0.5)  # 4 files, 2 pinned
    t.put(grp(1))
    t.set_pinned([h(1)], True)  # already held: pinned now
    t.put(grp(2))
    t.set_pinned([h(3)], True)
    t.put(grp(3))
    assert (t.stats().pinned_entries, t.stats().pinned_bytes) == (2, 2 * size)
    for i in range(4, 8):
        t.put(grp(i))
    assert held(t, range(1, 8)) == [1, 3, 6, 7]
    assert len(list(tmp_path.iterdir())) == 4
    t.set_pinned([h(1), h(3)], False)
    assert t.stats().pinned_entries == 0
    t.put(grp(8))
    t.put(grp(9))
    assert held(t, range(1, 10)) == [6, 7, 8, 9]
    assert DiskTier(tmp_path, 4 * size, FP).stats().pinned_entries == 0  # restart: unpinned


def test_tier_pins_cap_and_bad_fraction() -> None:
    p = TierPins(1000, 0.1)
    assert p.admit("a", 60) and not p.admit("b", 60) and p.admit("a", 60)
    p.release("a", evicted=True)
    assert (p.used, p.evictions, p.admit("b", 60)) == (0, 1, True)
    with pytest.raises(ValueError, match="max_pinned_fraction"):
        HostTier(100, max_pinned_fraction=1.5)
