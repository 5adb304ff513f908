"""Where files outside the package live: the shared data folder, the benchmark peers'
installs and scratch space. One place, used by every package (text, bench, analyze, tests).

=================  =====================  =========================  =======================
what               environment variable   source checkout            installed (a wheel)
=================  =====================  =========================  =======================
shared data        ``PREFIXCACHE_DATA``   ``<repo>/../shared/data``  error naming the variable
peer venvs         ``PREFIXCACHE_PEERS``  ``<repo>/.peers``          ``<user cache>/peers``
scratch            (none)                 ``<repo>/benchmarks/       ``<user cache>/scratch``
                                          _scratch``
=================  =====================  =========================  =======================

``<user cache>`` is ``$XDG_CACHE_HOME/prefixcache`` (default ``~/.cache/prefixcache``).
A source checkout is a folder holding ``pyproject.toml`` and this package, outside any
``site-packages``/``dist-packages`` folder; nothing here ever points inside an installed
package.
"""
from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
_INSTALL_DIRS = ("site-packages", "dist-packages")


def source_checkout() -> Path | None:
    """The repository root when the package runs from a source checkout, else ``None``."""
    root = _PACKAGE_DIR.parent
    if any(part in _INSTALL_DIRS for part in root.parts):
        return None
    return root if (root / "pyproject.toml").is_file() else None


def _user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "prefixcache"


def data_root() -> Path:
    """The shared data folder: ``$PREFIXCACHE_DATA``, else ``<repo>/../shared/data`` in a
    source checkout. The folder may not exist; callers check the paths they need.

    Raises:
        FileNotFoundError: not a source checkout and ``PREFIXCACHE_DATA`` is unset (the
            message names the variable).
    """
    env = os.environ.get("PREFIXCACHE_DATA")
    if env:
        return Path(env).expanduser()
    root = source_checkout()
    if root is None:
        raise FileNotFoundError("shared data folder unknown: set PREFIXCACHE_DATA to the "
                                "shared/data folder (prefixcache is not run from a checkout)")
    return (root.parent / "shared" / "data").resolve()


def peers_dir() -> Path:
    """Where ``scripts/install_peers.sh`` puts the peer venvs: ``$PREFIXCACHE_PEERS``,
    else ``<repo>/.peers`` in a checkout, else ``<user cache>/peers``."""
    env = os.environ.get("PREFIXCACHE_PEERS")
    if env:
        return Path(env).expanduser()
    root = source_checkout()
    return root / ".peers" if root is not None else _user_cache() / "peers"


def scratch_dir() -> Path:
    """Scratch space for benchmark runs (server logs, converted files):
    ``<repo>/benchmarks/_scratch`` in a checkout, else ``<user cache>/scratch``."""
    root = source_checkout()
    return root / "benchmarks" / "_scratch" if root is not None else _user_cache() / "scratch"
