"""The disk tier's directory holding things that are not its files: directories, FIFOs and
symlinks named ``*.kvpg`` are skipped (never opened, followed or removed), garbage regular
files are removed, and a budget above the free space only warns."""
from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

import pytest

from prefixcache.cache.tiers.disk_tier import DiskTier
from prefixcache.cache.tiers.tier_io import NotRegularFile, TierIO
from tests.cache.test_tiers_store import FP, grp, h

LOGGER = "prefixcache.cache.tiers.disk_tier"


def _build_within(seconds: float, *args) -> DiskTier:
    """A DiskTier built in a thread: a blocked open() fails the test instead of hanging."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(DiskTier(*args)), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "DiskTier start blocked"
    assert out, "DiskTier start raised"
    return out[0]


def test_non_regular_entries_are_skipped_and_kept(tmp_path: Path, caplog) -> None:
    d = tmp_path / "kv"
    DiskTier(d, 1 << 20, FP).put(grp(1))
    (good,) = d.glob("*.kvpg")
    elsewhere = tmp_path / "outside.kvpg"
    shutil.copy(good, elsewhere)  # a valid file of ours, but reached through a link
    (d / "dir.kvpg").mkdir()
    (d / "dir.kvpg" / "keep").write_bytes(b"x")
    (d / "dir.kvpg.tmp").mkdir()
    os.mkfifo(d / "fifo.kvpg")
    os.mkfifo(d / "fifo.kvpg.tmp")
    (d / "link.kvpg").symlink_to(elsewhere)
    (d / "dangling.kvpg").symlink_to(tmp_path / "missing")
    (d / "garbage.kvpg").write_bytes(b"not a page group")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        t = _build_within(20, d, 1 << 20, FP)
    assert (t.rebuilt_files, t.skipped_entries, t.stats().corrupt) == (1, 6, 1)
    assert t.lookup_run([h(1)]) == 1 and t.get([h(1)]) is not None
    assert not (d / "garbage.kvpg").exists()  # ours and broken: removed
    for name in ("dir.kvpg", "dir.kvpg.tmp", "fifo.kvpg", "fifo.kvpg.tmp", "link.kvpg",
                 "dangling.kvpg"):
        assert os.path.lexists(d / name), name  # not ours: left alone
    assert (d / "dir.kvpg" / "keep").read_bytes() == b"x" and elsewhere.exists()
    skipped = [r for r in caplog.records if "not regular files" in r.getMessage()]
    assert len(skipped) == 1 and "skipped 6 entries" in skipped[0].getMessage()
    assert t.put(grp(2)) and t.lookup_run([h(2)]) == 1  # and it keeps storing


def test_file_replaced_by_a_directory_is_a_miss_and_stays(tmp_path: Path) -> None:
    t = DiskTier(tmp_path, 1 << 20, FP)
    t.put(grp(1))
    (path,) = tmp_path.glob("*.kvpg")
    path.unlink()
    path.mkdir()
    assert t.get([h(1)]) is None and t.lookup_run([h(1)]) == 0
    assert path.is_dir() and t.stats().failures == 1


@pytest.mark.parametrize("kind", ["fifo", "dir", "symlink"])
def test_tier_io_read_refuses_non_regular_files(kind: str, tmp_path: Path) -> None:
    p = tmp_path / "x.kvpg"
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "dir":
        p.mkdir()
    else:
        (tmp_path / "real").write_bytes(b"data")
        p.symlink_to(tmp_path / "real")
    with pytest.raises(NotRegularFile):
        TierIO().read(p, 8)  # returns at once (a FIFO would block a plain open())
    TierIO().remove(p)
    assert os.path.lexists(p)


def test_budget_above_free_space_warns_once(tmp_path: Path, caplog) -> None:
    free = shutil.disk_usage(tmp_path).free
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        DiskTier(tmp_path / "small", 1 << 20, FP)
        assert not [r for r in caplog.records if "free space" in r.getMessage()]
        t = DiskTier(tmp_path / "big", free + (1 << 40), FP)
    warned = [r for r in caplog.records if "free space" in r.getMessage()]
    assert len(warned) == 1 and str(tmp_path / "big") in warned[0].getMessage()
    assert t.put(grp(1)) and t.lookup_run([h(1)]) == 1  # allowed, and it works
