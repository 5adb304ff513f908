"""Tier budgets and directories checked against the model when the engine is built: a host
or disk budget smaller than one KV page, and a disk directory that is a file or is not
writable, are a ValueError naming the field (with the minimum), never a silent no-op or a
bare OSError; the smallest accepted budget is exactly one page."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefixcache import LLM
from prefixcache.cache.tiers import disk_tier

PAGE = 2 * 4 * 16 * 4 * 32 * 4  # bytes of one KV page of builtin:tiny (K, V, 4 layers, fp32)
MINIMUM = f"the minimum is {PAGE} bytes ({PAGE / (1 << 30):.6f} GiB)"


def build(**kw) -> LLM:
    return LLM("builtin:tiny", num_pages=8, **kw)


def test_host_budget_below_one_page_names_the_field_and_minimum():
    with pytest.raises(ValueError) as e:
        build(host_cache_bytes=10)
    assert str(e.value) == f"host_cache_bytes: 10 bytes is less than one KV page of this " \
                           f"model; {MINIMUM}"
    llm = build(host_cache_bytes=PAGE)  # one page is enough
    assert llm.engine.tiers is not None and llm.engine.tiers.tiers[0].name == "host"
    llm.close()


def test_disk_budget_below_one_page_names_the_field_and_minimum(tmp_path: Path):
    with pytest.raises(ValueError) as e:
        build(disk_cache_dir=str(tmp_path), disk_cache_bytes=PAGE - 1)
    assert str(e.value) == f"disk_cache_bytes: {PAGE - 1} bytes is less than one KV page of " \
                           f"this model; {MINIMUM}"
    build(disk_cache_dir=str(tmp_path), disk_cache_bytes=PAGE).close()


def test_no_host_tier_needs_no_minimum():
    assert build(host_cache_bytes=0).engine.tiers is None


@pytest.mark.parametrize("path", ["/proc/version", "FILE", "FILE/sub"])
def test_disk_dir_that_is_not_a_directory(path: str, tmp_path: Path):
    file = tmp_path / "file"
    file.write_bytes(b"x")
    path = path.replace("FILE", str(file))
    with pytest.raises(ValueError) as e:
        build(disk_cache_dir=path)
    assert str(e.value) == f"disk_cache_dir: {path!r} is not a directory"


def test_unwritable_disk_dir(tmp_path: Path, monkeypatch):
    real = os.access
    monkeypatch.setattr(disk_tier.os, "access",  # root may write anywhere: pretend
                        lambda p, mode: False if Path(p) == tmp_path else real(p, mode))
    with pytest.raises(ValueError) as e:
        build(disk_cache_dir=str(tmp_path))
    assert str(e.value) == f"disk_cache_dir: {str(tmp_path)!r} is not writable"


def test_cli_names_the_flag_and_field_with_the_minimum(capsys):
    from prefixcache.cli import main

    code = main(["generate", "hi", "--model", "builtin:tiny", "--host-cache-gib", "0.000001",
                 "--num-pages", "8"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == ("prefixcache generate: error: --host-cache-gib (host_cache_bytes): 1073 "
                   f"bytes is less than one KV page of this model; {MINIMUM}")
