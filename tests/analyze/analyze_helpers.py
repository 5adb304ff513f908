"""Helpers for the analyzer tests (a uniquely named module: import it as
``from analyze_helpers import tokreq``)."""
from __future__ import annotations

from prefixcache.analyze.records import Request, TokenizedRequest


def tokreq(rid, prompt, response=(), tenant=None, ts=None, conversation=None,
           boundaries=None, roles=None, usage=None):
    """A TokenizedRequest built directly from token ids (no tokenizer involved)."""
    req = Request(request_id=rid, prompt=list(prompt), tenant=tenant, timestamp=ts,
                  conversation=conversation, usage=usage)
    b = boundaries if boundaries is not None else [len(prompt)]
    return TokenizedRequest(request=req, prompt_ids=list(prompt), response_ids=list(response),
                            boundaries=b, boundary_roles=roles or ["user"] * len(b))
