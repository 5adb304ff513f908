"""One place for the shared data folder and the peers' installs (prefixcache/paths.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from prefixcache import paths

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def installed(monkeypatch, tmp_path):
    """The package as a wheel would place it: inside site-packages, no pyproject.toml."""
    pkg = tmp_path / "lib" / "python3.12" / "site-packages" / "prefixcache"
    pkg.mkdir(parents=True)
    (pkg.parent / "pyproject.toml").write_text("")  # even a stray file does not count
    monkeypatch.setattr(paths, "_PACKAGE_DIR", pkg)
    for var in ("PREFIXCACHE_DATA", "PREFIXCACHE_PEERS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def test_checkout_defaults(monkeypatch):
    for var in ("PREFIXCACHE_DATA", "PREFIXCACHE_PEERS"):
        monkeypatch.delenv(var, raising=False)
    assert paths.source_checkout() == REPO
    assert paths.data_root() == (REPO.parent / "shared" / "data").resolve()
    assert paths.peers_dir() == REPO / ".peers"
    assert paths.scratch_dir() == REPO / "benchmarks" / "_scratch"


def test_environment_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFIXCACHE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("PREFIXCACHE_PEERS", str(tmp_path / "peers"))
    assert paths.data_root() == tmp_path / "data"
    assert paths.peers_dir() == tmp_path / "peers"


def test_installed_package_never_points_inside_site_packages(installed, monkeypatch):
    assert paths.source_checkout() is None
    with pytest.raises(FileNotFoundError, match="PREFIXCACHE_DATA"):
        paths.data_root()
    assert paths.peers_dir() == installed / "cache" / "prefixcache" / "peers"
    assert paths.scratch_dir() == installed / "cache" / "prefixcache" / "scratch"
    monkeypatch.setenv("PREFIXCACHE_DATA", str(installed / "data"))
    assert paths.data_root() == installed / "data"


def test_users_of_the_data_root_name_the_variable(installed):
    from prefixcache.bench.datasets import DataMissing, data_path
    from prefixcache.text.loading import TokenizerError, load_tokenizer

    with pytest.raises(DataMissing, match="PREFIXCACHE_DATA"):
        data_path("prompts")
    with pytest.raises(TokenizerError, match="'qwen2'.*PREFIXCACHE_DATA"):
        load_tokenizer("qwen2")
