"""Host-RAM and disk tiers: visibility after store, budgets, restart, injected faults."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from prefixcache.cache.tiers.base import Tier
from prefixcache.cache.tiers.disk_tier import DiskTier
from prefixcache.cache.tiers.format import PageGroup, encode
from prefixcache.cache.tiers.host_tier import HostTier
from prefixcache.cache.tiers.store_queue import StoreQueue
from prefixcache.cache.tiers.tier_io import FaultyIO, TierIO
from tests.helpers.wait import DEADLINE_S

FP = b"fp"
SHAPE = (2, 2, 4)  # 16 float32 = 64 bytes per page


def grp(*ids: int, fp: bytes = FP) -> PageGroup:
    return PageGroup(fp, tuple(bytes([i]) * 16 for i in ids),
                     tuple((i, i + 1, i + 2, i + 3) for i in ids), "float32", SHAPE,
                     b"".join(bytes([i]) * 64 for i in ids))


def h(i: int) -> bytes:
    return bytes([i]) * 16


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_put_get_lookup_run(kind: str, tmp_path: Path) -> None:
    t: Tier = HostTier(10_000) if kind == "host" else DiskTier(tmp_path, 10_000, FP)
    assert isinstance(t, Tier)
    assert t.lookup_run([h(1), h(2)]) == 0 and t.get([h(1)]) is None
    assert t.put(grp(1, 2)) and t.put(grp(3))
    assert t.lookup_run([h(1), h(2), h(3), h(4), h(1)]) == 3
    g = t.get([h(3), h(1)])
    assert g is not None and g.hashes == (h(3), h(1))
    assert g.payload == bytes([3]) * 64 + bytes([1]) * 64
    assert g.token_ids == ((3, 4, 5, 6), (1, 2, 3, 4))
    assert t.put(grp(1, 2)) and t.stats().skipped == 1 and t.stats().stores == 2


def test_host_budget_lru_never_evicts_own_store() -> None:
    t = HostTier(64 * 3)
    t.put(grp(1))
    t.put(grp(2))
    t.get([h(1)])  # 2 is now least recent
    t.put(grp(3, 4))
    assert [t.contains(h(i)) for i in (1, 2, 3, 4)] == [True, False, True, True]
    assert t.stats().bytes_used == 192 and t.stats().evictions == 1
    assert not t.put(grp(5, 6, 7, 8)) and t.stats().rejected == 1
    t.put(grp(3, 4, 5))  # 3 and 4 are held: only 1 may go
    assert [t.contains(h(i)) for i in (1, 3, 4, 5)] == [False, True, True, True]


def test_disk_budget_never_evicts_own_store(tmp_path: Path) -> None:
    size = len(encode(grp(1)))
    t = DiskTier(tmp_path, 2 * size, FP)
    t.put(grp(1))
    t.put(grp(2))
    t.put(grp(3))
    assert [t.contains(h(i)) for i in (1, 2, 3)] == [False, True, True]
    assert len(list(tmp_path.glob("*.kvpg"))) == 2 and t.stats().bytes_used == 2 * size
    assert not t.put(grp(4, 5, 6)) and t.stats().rejected == 1


def test_disk_restart_hits_and_rewrites_nothing(tmp_path: Path) -> None:
    t = DiskTier(tmp_path, 1 << 20, FP)
    t.put(grp(1, 2))
    t.put(grp(3))
    (tmp_path / "deadbeef.kvpg.tmp").write_bytes(b"half")  # a killed store
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.kvpg")}
    t2 = DiskTier(tmp_path, 1 << 20, FP)
    assert t2.rebuilt_files == 2 and t2.lookup_run([h(1), h(2), h(3)]) == 3
    assert not (tmp_path / "deadbeef.kvpg.tmp").exists()
    g = t2.get([h(1), h(2), h(3)])
    assert g is not None and g.payload == b"".join(bytes([i]) * 64 for i in (1, 2, 3))
    assert t2.put(grp(1, 2)) and t2.put(grp(3))
    assert t2.stats().stores == 0 and t2.stats().skipped == 2
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.kvpg")} == mtimes


def test_disk_other_fingerprint_is_a_miss(tmp_path: Path) -> None:
    DiskTier(tmp_path, 1 << 20, FP).put(grp(1))
    other = DiskTier(tmp_path, 1 << 20, b"other-model")
    assert other.lookup_run([h(1)]) == 0 and other.get([h(1)]) is None
    assert len(list(tmp_path.glob("*.kvpg"))) == 1  # left alone


@pytest.mark.parametrize("kind", ["enospc", "mid_write"])
def test_failed_store_is_invisible(kind: str, tmp_path: Path) -> None:
    io = FaultyIO()
    t = DiskTier(tmp_path, 1 << 20, FP, io=io)
    io.arm(kind)
    assert not t.put(grp(1))
    assert t.lookup_run([h(1)]) == 0 and list(tmp_path.iterdir()) == []
    assert t.stats().failures == 1 and io.injected[kind] == 1
    assert DiskTier(tmp_path, 1 << 20, FP).lookup_run([h(1)]) == 0
    assert t.put(grp(1)) and t.lookup_run([h(1)]) == 1


@pytest.mark.parametrize("kind", ["short_read", "flip_byte", "truncate"])
def test_bad_read_is_a_miss_and_removes_the_entry(kind: str, tmp_path: Path) -> None:
    io = FaultyIO()
    t = DiskTier(tmp_path, 1 << 20, FP, io=io)
    t.put(grp(1, 2))
    io.arm(kind)
    assert t.get([h(1)]) is None
    assert t.lookup_run([h(1), h(2)]) == 0 and list(tmp_path.iterdir()) == []
    assert t.stats().corrupt == 1 == io.injected[kind]


def test_concurrent_store_and_lookup_never_sees_partial(tmp_path: Path) -> None:
    started, release = threading.Event(), threading.Event()

    class SlowIO(TierIO):
        def _write(self, f: object, data: bytes) -> None:
            f.write(data[:10])  # type: ignore[attr-defined]
            started.set()
            release.wait(DEADLINE_S)
            f.write(data[10:])  # type: ignore[attr-defined]

    t = DiskTier(tmp_path, 1 << 20, FP, io=SlowIO())
    th = threading.Thread(target=t.put, args=(grp(1),))
    th.start()
    assert started.wait(DEADLINE_S)
    assert t.lookup_run([h(1)]) == 0 and t.get([h(1)]) is None
    assert not list(tmp_path.glob("*.kvpg"))  # only the temporary name exists
    release.set()
    th.join(DEADLINE_S)
    g = t.get([h(1)])
    assert g is not None and g.payload == bytes([1]) * 64


def test_store_queue_drops_when_full_and_flushes(tmp_path: Path) -> None:
    gate = threading.Event()

    class Blocking(HostTier):
        def put(self, group: PageGroup) -> bool:
            gate.wait(DEADLINE_S)
            return super().put(group)

    host = Blocking(1 << 20)
    disk = DiskTier(tmp_path, 1 << 20, FP)
    q = StoreQueue([host, disk], max_pending=2)
    results = [q.submit(grp(i)) for i in range(1, 6)]
    # the worker holds one, the queue two: at least two of five are dropped
    assert results[:2] == [True, True] and q.dropped == results.count(False) >= 2
    gate.set()
    q.flush()
    stored = [i for i in range(1, 6) if results[i - 1]]
    assert [host.contains(h(i)) for i in stored] == [True] * len(stored)
    assert disk.lookup_run([h(i) for i in stored]) == len(stored)
    q.close()
    with pytest.raises(ValueError, match="max_pending"):
        StoreQueue([], max_pending=0)


@pytest.mark.parametrize("kind", ["host", "disk"])
def test_get_returns_the_leading_pages_held_and_checks_token_ids(kind: str,
                                                                 tmp_path: Path) -> None:
    t: Tier = HostTier(10_000) if kind == "host" else DiskTier(tmp_path, 10_000, FP)
    assert t.put(grp(1)) and t.put(grp(2))
    g = t.get([h(1), h(2), h(3)])  # page 3 is not held: the two before it
    assert g is not None and g.hashes == (h(1), h(2))
    assert g.payload == bytes([1]) * 64 + bytes([2]) * 64
    s = t.stats()
    assert (s.hits, s.misses, s.corrupt) == (1, 1, 0)
    g = t.get([h(1), h(2)], [(1, 2, 3, 4), (0, 0, 0, 0)])  # page 2 holds other tokens
    assert g is not None and g.hashes == (h(1),) and g.token_ids == ((1, 2, 3, 4),)
    s = t.stats()
    assert (s.corrupt, s.pages) == (1, 1) and t.contains(h(1)) and not t.contains(h(2))
    assert t.get([h(2)]) is None


def test_store_queue_counts_the_pages_it_drops_and_those_a_tier_raised_on() -> None:
    class Raising(HostTier):
        def put(self, group: PageGroup) -> bool:
            raise RuntimeError("a tier bug")

    q = StoreQueue([Raising(1 << 20)], max_pending=4)
    assert q.submit(grp(1, 2, 3)) and q.submit(grp(4))
    q.flush()
    assert (q.errors, q.error_pages) == (2, 4)
    q.close()  # no worker: the queue fills
    assert [q.submit(grp(i, i + 1)) for i in range(0, 12, 2)] == [True] * 4 + [False] * 2
    assert (q.dropped, q.dropped_pages) == (2, 4)
