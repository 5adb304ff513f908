"""Helpers for the analyzer tests: handmade logs written to tmp files."""
from __future__ import annotations

import json

import pytest

from prefixcache.analyze.records import Request, TokenizedRequest


@pytest.fixture
def write_jsonl(tmp_path):
    """``write_jsonl(records, name="log.jsonl") -> path``."""
    def write(records, name="log.jsonl"):
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
        return path
    return write


def tokreq(rid, prompt, response=(), tenant=None, ts=None, conversation=None,
           boundaries=None, roles=None, usage=None):
    """A TokenizedRequest built directly from token ids (no tokenizer involved)."""
    req = Request(request_id=rid, prompt=list(prompt), tenant=tenant, timestamp=ts,
                  conversation=conversation, usage=usage)
    b = boundaries if boundaries is not None else [len(prompt)]
    return TokenizedRequest(request=req, prompt_ids=list(prompt), response_ids=list(response),
                            boundaries=b, boundary_roles=roles or ["user"] * len(b))
