"""Comparing a request's output with a reference run (a cold run of the same prompt)."""
from __future__ import annotations

import pytest


def same_output(out, ref, abs_tol: float = 1e-4) -> None:
    """``out`` generated the same tokens as ``ref``, with the same top logprob ids and
    logprobs within ``abs_tol`` (both requested with ``logprobs``)."""
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
    for got, want in zip(out.outputs[0].logprobs, ref.outputs[0].logprobs):
        assert got.keys() == want.keys()
        for t in got:
            assert got[t].logprob == pytest.approx(want[t].logprob, abs=abs_tol)
