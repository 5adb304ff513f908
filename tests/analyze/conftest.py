"""Helpers for the analyzer tests: handmade logs written to tmp files."""
from __future__ import annotations

import json

import pytest


@pytest.fixture
def write_jsonl(tmp_path):
    """``write_jsonl(records, name="log.jsonl") -> path``."""
    def write(records, name="log.jsonl"):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return path
    return write
