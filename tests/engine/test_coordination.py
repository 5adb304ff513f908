"""Followers: page-by-page following, handover when the leader goes, no deadlock."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from tests.engine.conftest import prompt_ids

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def make_llm(path, **kw):
    kw.setdefault("num_pages", 256)
    kw.setdefault("shuffle_seed", 4)
    kw.setdefault("max_num_batched_tokens", 64)
    return LLM(path, block_size=16, **kw)


def run_all(eng):
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
        check_invariants(eng.cache)
    return {o.request_id: o for o in outs if o.finished}


def reference(path, prompt):
    return make_llm(path).generate([{"prompt_token_ids": prompt}], GREEDY)[0].outputs[0].token_ids


def test_follower_takes_each_page_as_it_publishes(llama):
    prompt = prompt_ids(320, seed=31)
    eng = make_llm(llama.path).engine
    eng.add_request("A", prompt, GREEDY)
    eng.add_request("B", prompt, GREEDY)
    seen = []
    while eng.requests["A"].num_computed_tokens < 320 - 1:
        eng.step()
        b = eng.requests["B"].page_table
        seen.append((eng.requests["A"].num_computed_tokens, b.num_cached_tokens,
                     b.num_computed_tokens))
    # A computes 64 tokens per step; B never computes a prompt token, and after each of
    # A's steps it holds every page A published by the step before (one step behind).
    assert [s[0] for s in seen] == [64, 128, 192, 256, 320]
    assert [s[1] for s in seen] == [0, 64, 128, 192, 256]
    assert all(cached == computed for _, cached, computed in seen)
    outs = run_all(eng)
    assert eng.stats()["prefill_tokens_computed"] == 320 + 16  # B's last page only
    assert outs["B"].num_cached_tokens == 304
    assert outs["A"].outputs[0].token_ids == outs["B"].outputs[0].token_ids == reference(
        llama.path, prompt)


@pytest.mark.parametrize("how", ["abort", "preempt", "fail"])
def test_follower_takes_over_when_the_leader_goes(llama, how):
    prompt = prompt_ids(320, seed=32)
    llm = make_llm(llama.path)
    eng = llm.engine
    eng.add_request("A", prompt, GREEDY)
    eng.add_request("B", prompt, GREEDY)
    eng.step()
    eng.step()  # A has computed 128 tokens; B holds 64 and waits on A's page 4
    assert eng.requests["B"].page_table.num_computed_tokens == 64
    if how == "abort":
        eng.abort_request("A")
    elif how == "preempt":
        eng.scheduler.preempt(eng.requests["A"])
    else:
        real = eng.model.forward

        def fail_once(batch, kv):
            eng.model.forward = real
            raise RuntimeError("injected")

        eng.model.forward = fail_once
    outs = run_all(eng)
    ref = reference(llama.path, prompt)
    assert outs["B"].outputs[0].token_ids == ref
    computed = llm.stats()["prefill_tokens_computed"]
    if how == "abort":
        assert computed == 320  # B computed pages 8.. itself, each page once
        assert outs["B"].num_cached_tokens == 128
    elif how == "fail":
        # the failed step (A's tokens 128-192) published nothing; B took over from 128
        assert outs["A"].outputs[0].finish_reason == "error"
        assert computed == 320
    else:
        # A was preempted at 128; B led from there; A came back and followed B.
        assert outs["A"].outputs[0].token_ids == ref
        assert computed == 320 + 16
    stats = llm.stats()
    assert stats["pages_live"] == 0 and not eng.cache.tables


def test_no_deadlock_on_shared_prefix_with_different_tails(llama):
    p = prompt_ids(200, seed=33)
    a = p + prompt_ids(90, seed=34)
    b = p + prompt_ids(70, seed=35)
    eng = make_llm(llama.path, max_num_batched_tokens=40).engine
    eng.add_request("A", a, GREEDY)
    eng.step()
    eng.add_request("B", b, GREEDY)
    for _ in range(3):
        eng.step()
    eng.add_request("A2", a, GREEDY)
    eng.add_request("B2", b, GREEDY)
    outs = run_all(eng)
    assert set(outs) == {"A", "B", "A2", "B2"}
    for x, ids in (("A", a), ("B", b)):
        assert outs[x].outputs[0].token_ids == outs[x + "2"].outputs[0].token_ids
        assert outs[x].outputs[0].token_ids == reference(llama.path, ids)
    # P's 12 full pages are computed once; B computes the rest of its own; A2 and B2
    # recompute only their partial last pages (290 = 18*16 + 2, 270 = 16*16 + 14).
    assert eng.stats()["prefill_tokens_computed"] == 290 + (270 - 192) + 2 + 14
