"""The generated reference pages (``scripts/gen_config_docs.py``) match the code: the
pages are regenerated in memory and compared with the committed files."""
from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

from prefixcache.config import EngineConfig

REPO = Path(__file__).resolve().parents[1]


def generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs",
                                                  REPO / "scripts" / "gen_config_docs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_committed_reference_pages_are_current():
    pages = generator().render()
    stale = [str(p) for p, text in pages.items()
             if not (REPO / p).is_file() or (REPO / p).read_text() != text]
    assert not stale, f"stale: {stale}; run python scripts/gen_config_docs.py"
    committed = {p.relative_to(REPO) for p in (REPO / "docs" / "reference").rglob("*.md")}
    assert committed == set(pages), "a reference page has no generator (or was not written)"


def test_configuration_page_has_every_field_with_its_flag_and_default():
    gen = generator()
    text = gen.configuration_page()
    flags = gen.flag_of_fields()
    assert flags["kv_cache_bytes"] == "--kv-cache-gib"
    assert flags["enable_prefix_caching"] == "--no-prefix-caching"
    assert flags["kv_store_url"] == "--kv-store"
    assert "shuffle_seed" not in flags  # test-only field: no flag
    for f in dataclasses.fields(EngineConfig):
        assert f"\n## `{f.name}` " in text, f.name
    assert "| [`block_size`](#block-size) | `--block-size` | `int` | `16` |" in text
    assert "| [`max_model_len`](#max-model-len) | `--max-model-len` | `int or None` | " \
           "the model's context length |" in text
    # the docstring's text for a field, reST markup turned into Markdown
    assert "``" not in text and ":data:" not in text


def test_cli_pages_list_every_flag_of_serve():
    gen = generator()
    serve = gen.subparsers()["serve"]
    page = gen.cli_page("serve", serve)
    for action in serve._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}`" in page, flag
    assert "| `--port` | PORT | `8000` | TCP port to listen on |" in page
