"""The documentation site builds with ``mkdocs build --strict`` (as ``make docs`` does):
a broken link or anchor, or a page under ``docs/`` missing from the nav, fails the build."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site),
         "--config-file", str(REPO / "mkdocs.yml")],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    # every page of docs/ is rendered, so none is left out of the site
    pages = sorted(p.relative_to(REPO / "docs").with_suffix("")
                   for p in (REPO / "docs").rglob("*.md"))
    assert len(pages) >= 20, pages
    for page in pages:
        html = (site / page / "index.html" if page.name != "index"
                else site / page.parent / "index.html")
        assert html.is_file(), page


def nav_pages(node) -> list[str]:
    """Every page path of a (parsed) mkdocs nav."""
    if isinstance(node, str):
        return [node]
    items = node.values() if isinstance(node, dict) else node
    return [page for item in items for page in nav_pages(item)]


def test_every_docs_page_is_in_the_nav():
    nav = nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    pages = {p.relative_to(REPO / "docs").as_posix() for p in (REPO / "docs").rglob("*.md")}
    assert pages == set(nav), (sorted(pages - set(nav)), sorted(set(nav) - pages))
