"""The disk tier's directory: created when missing; a path that is (or lies under) a file,
that cannot be created, or that is not writable is a ValueError naming ``disk_cache_dir``."""
from __future__ import annotations

from pathlib import Path

import pytest

from prefixcache.cache.tiers import disk_tier
from prefixcache.cache.tiers.disk_tier import DiskTier
from tests.cache.test_tiers_store import FP


def test_missing_directory_is_created(tmp_path: Path) -> None:
    d = tmp_path / "a" / "b"
    assert DiskTier(d, 1 << 20, FP).directory == d and d.is_dir()


@pytest.mark.parametrize("under", [False, True])
def test_a_file_is_not_a_directory(tmp_path: Path, under: bool) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x")
    path = f / "sub" if under else f
    with pytest.raises(ValueError) as e:
        DiskTier(path, 1 << 20, FP)
    assert str(e.value) == f"disk_cache_dir: {str(path)!r} is not a directory"
    assert f.read_bytes() == b"x"


def test_cannot_create_is_a_value_error(tmp_path: Path, monkeypatch) -> None:
    def refuse(self, *a, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(ValueError) as e:
        DiskTier(tmp_path / "new", 1 << 20, FP)
    assert str(e.value) == (f"disk_cache_dir: {str(tmp_path / 'new')!r} cannot be created: "
                            "Permission denied")


def test_not_writable_is_a_value_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(disk_tier.os, "access", lambda p, mode: False)  # root writes anyway
    with pytest.raises(ValueError) as e:
        DiskTier(tmp_path, 1 << 20, FP)
    assert str(e.value) == f"disk_cache_dir: {str(tmp_path)!r} is not writable"
