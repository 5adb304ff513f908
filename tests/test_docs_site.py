"""The documentation site builds with ``mkdocs build --strict`` (as ``make docs`` does):
a broken link or anchor, or a page under ``docs/`` missing from the nav, fails the build."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def test_every_docs_page_is_in_the_nav():
    config = (REPO / "mkdocs.yml").read_text()
    for p in (REPO / "docs").rglob("*.md"):
        rel = p.relative_to(REPO / "docs").as_posix()
        assert rel in config, f"{rel} is not in mkdocs.yml's nav"
