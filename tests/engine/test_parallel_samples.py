"""Parallel samples (``n > 1``, ``best_of``) share one prefill of the prompt: work and
pages counted, invariants checked after every step, seeds reproducible per index."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from prefixcache.cache.page_pool import PageState

BS = 16
PROMPT = [(7 * i + 5) % 250 + 1 for i in range(40)]  # 2 full pages + 8 tokens


def make_llm(num_pages: int = 64, **kw) -> LLM:
    return LLM("builtin:tiny", num_pages=num_pages, block_size=BS, max_model_len=256, **kw)


def drive(llm: LLM, rid: str, prompt: list[int], params: SamplingParams, on_step=None):
    """Run one request step by step, checking the page invariants after every step;
    returns its final output."""
    eng = llm.engine
    eng.add_request(rid, prompt, params)
    final = None
    steps = 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                final = out
        check_invariants(eng.cache)
        steps += 1
        if on_step is not None:
            on_step(steps)
    assert final is not None and final.request_id == rid
    return final


def assert_nothing_held(llm: LLM) -> None:
    st = llm.stats()
    assert st["pages_live"] == 0
    assert st["pages_free"] + st["pages_cached"] == st["pages_total"]
    assert llm.engine.cache.tables == {} and llm.engine.requests == {}
    assert llm.engine.groups == {}


def test_n8_costs_one_prefill_and_shares_the_prompt_pages():
    with make_llm() as one, make_llm() as eight:
        one.generate({"prompt_token_ids": PROMPT}, SamplingParams(max_tokens=6, seed=1))
        seen = {}

        def look(step):
            if step == 1:  # the prefill step: every member forked from the parent
                tables = [eight.engine.cache.tables[r] for r in
                          ["r"] + [f"r#{i}" for i in range(1, 8)]]
                seen["pages"] = [list(t.pages) for t in tables]
                pool = eight.engine.cache.pool
                seen["refs"] = [pool.ref_count[p] for p in tables[0].pages]
                seen["states"] = [pool.state[p] for p in tables[0].pages]

        out = drive(eight, "r", PROMPT, SamplingParams(n=8, max_tokens=6, seed=1), look)
        s1, s8 = one.stats(), eight.stats()
        assert s8["prefill_tokens_computed"] == s1["prefill_tokens_computed"] == 40
        # decode: 5 more tokens per sample, the first one of each came from the prefill
        assert s8["decode_tokens_computed"] == 8 * s1["decode_tokens_computed"] == 8 * 5
        # the 2 full prompt pages referenced by 7 children, the partial page copied once each
        assert s8["fork_shared_pages"] == 2 * 7 and s8["fork_copied_pages"] == 7
        assert s8["prefix_cache_queries"] == 40  # the prompt counts once
        assert s8["steps"] == s1["steps"] == 6  # the samples decode in the same steps
        pages = seen["pages"]
        assert all(p[:2] == pages[0][:2] for p in pages)
        assert len({p[2] for p in pages}) == 8  # one private partial page each
        assert seen["refs"] == [8, 8, 1]
        assert seen["states"][:2] == [PageState.PUBLISHED] * 2
        assert seen["states"][2] == PageState.PENDING
        assert [c.index for c in out.outputs] == list(range(8))
        assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in out.outputs)
        assert out.num_cached_tokens == 0
        assert_nothing_held(eight)


def test_prompt_ending_on_a_page_boundary_copies_nothing():
    with make_llm() as llm:
        out = drive(llm, "b", PROMPT[:32], SamplingParams(n=4, max_tokens=3, seed=2))
        st = llm.stats()
        assert st["prefill_tokens_computed"] == 32
        assert st["fork_shared_pages"] == 2 * 3 and st["fork_copied_pages"] == 0
        assert len(out.outputs) == 4
        assert_nothing_held(llm)


def test_greedy_n2_equals_n1_and_a_warm_prompt_is_cached_once():
    with make_llm() as llm:
        ref = llm.generate({"prompt_token_ids": PROMPT},
                           SamplingParams(max_tokens=8, temperature=0.0))[0]
        out = drive(llm, "g", PROMPT, SamplingParams(n=2, max_tokens=8, temperature=0.0))
        want = ref.outputs[0].token_ids
        assert [c.token_ids for c in out.outputs] == [want, want]
        assert out.num_cached_tokens == 32  # as for one request: 2 full pages hit
        assert llm.stats()["prefill_tokens_computed"] == 40 + 8
        assert_nothing_held(llm)


def test_seeded_samples_are_reproducible_per_index():
    params = SamplingParams(n=4, max_tokens=8, temperature=1.0, seed=11)
    with make_llm() as llm:
        a = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
        b = llm.generate({"prompt_token_ids": PROMPT}, params)[0]  # warm: prompt cached
        assert b.num_cached_tokens == 32 and a.num_cached_tokens == 0
        toks = [c.token_ids for c in a.outputs]
        assert toks == [c.token_ids for c in b.outputs]
        assert len({tuple(t) for t in toks}) == 4  # four different samples
        # sample i samples with seed + i, as vLLM does
        for i in range(4):
            single = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(
                max_tokens=8, temperature=1.0, seed=11 + i))[0]
            assert single.outputs[0].token_ids == toks[i]
        assert_nothing_held(llm)


def test_best_of_returns_the_n_highest_cumulative_logprobs():
    with make_llm() as llm:
        every = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(
            n=4, max_tokens=6, seed=5, logprobs=0))[0]
        best = drive(llm, "best", PROMPT, SamplingParams(n=2, best_of=4, max_tokens=6, seed=5))
        ranked = sorted(every.outputs, key=lambda c: -c.cumulative_logprob)
        assert [c.token_ids for c in best.outputs] == [c.token_ids for c in ranked[:2]]
        assert [c.index for c in best.outputs] == [0, 1]
        assert [c.cumulative_logprob for c in best.outputs] == pytest.approx(
            [c.cumulative_logprob for c in ranked[:2]])
        assert all(c.logprobs is None for c in best.outputs)  # not asked for
        assert llm.stats()["prefill_tokens_computed"] == 40 + 8  # one prefill each
        assert_nothing_held(llm)


def test_best_of_emits_only_the_final_output():
    with make_llm() as llm:
        eng = llm.engine
        eng.add_request("q", PROMPT, SamplingParams(n=1, best_of=3, max_tokens=4, seed=1))
        outs = []
        while eng.has_unfinished_requests():
            outs.extend(eng.step())
        assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs) == 1


def test_streaming_outputs_carry_every_sample():
    with make_llm() as llm:
        eng = llm.engine
        eng.add_request("s", PROMPT, SamplingParams(n=3, max_tokens=4, seed=3))
        outs = []
        while eng.has_unfinished_requests():
            outs.extend(eng.step())
        assert len(outs) == 4  # one per step, all samples together
        assert [[c.num_tokens for c in o.outputs] for o in outs] == [
            [1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4]]
        assert [o.finished for o in outs] == [False, False, False, True]
        assert {o.request_id for o in outs} == {"s"}


def test_abort_mid_decode_frees_every_page():
    with make_llm() as llm:
        eng = llm.engine
        eng.add_request("a", PROMPT, SamplingParams(n=8, max_tokens=50, seed=4))
        for _ in range(3):
            eng.step()
            check_invariants(eng.cache)
        assert llm.stats()["pages_live"] == 2 + 8  # shared prompt pages + 8 partial ones
        assert eng.abort_request("a")
        assert not eng.abort_request("a")
        (out,) = eng.step()
        assert out.request_id == "a" and out.finished
        assert [c.finish_reason for c in out.outputs] == ["abort"] * 8
        check_invariants(eng.cache)
        assert_nothing_held(llm)
        assert llm.stats()["requests_aborted"] == 1


def test_abort_before_the_fork_ends_every_sample():
    with make_llm(max_num_batched_tokens=16) as llm:  # prefill in chunks of 16
        eng = llm.engine
        eng.add_request("p", PROMPT, SamplingParams(n=3, max_tokens=5, seed=4))
        eng.step()  # first chunk only
        assert eng.abort_request("p")
        (out,) = eng.step()
        assert [c.finish_reason for c in out.outputs] == ["abort"] * 3
        assert [c.token_ids for c in out.outputs] == [[], [], []]
        check_invariants(eng.cache)
        assert_nothing_held(llm)


def test_a_preempted_sample_recomputes_from_the_cache():
    params = SamplingParams(n=4, max_tokens=40, seed=9, ignore_eos=True)
    with make_llm() as roomy:
        want = [c.token_ids for c in roomy.generate({"prompt_token_ids": PROMPT}, params)[0]
                .outputs]
    with make_llm(num_pages=12) as tight:  # 4 samples of 80 tokens need 2 + 4 * 3 pages
        out = drive(tight, "t", PROMPT, params)
        assert tight.stats()["num_preemptions"] > 0
        assert [c.token_ids for c in out.outputs] == want
        assert all(c.finish_reason == "length" for c in out.outputs)
        assert_nothing_held(tight)


def test_a_fork_without_pages_waits_and_recomputes_the_partial_page():
    params = SamplingParams(n=2, max_tokens=4, seed=6, ignore_eos=True)
    with make_llm() as roomy:
        want = [c.token_ids for c in roomy.generate({"prompt_token_ids": PROMPT}, params)[0]
                .outputs]
    with LLM("builtin:tiny", num_pages=3, block_size=BS) as tight:  # the prompt's 3 pages
        out = drive(tight, "w", PROMPT, params)
        st = tight.stats()
        assert st["fork_shared_pages"] == st["fork_copied_pages"] == 0
        # the second sample hit the 2 full pages and computed the 8 + 1 after them
        assert st["prefill_tokens_computed"] == 40 + 9
        assert [c.token_ids for c in out.outputs] == want
        assert_nothing_held(tight)


def test_prefill_only_samples_finish_without_pages():
    with make_llm() as llm:
        out = drive(llm, "z", PROMPT, SamplingParams(n=3, max_tokens=0))
        assert [(c.token_ids, c.finish_reason) for c in out.outputs] == [([], "length")] * 3
        assert llm.stats()["fork_copied_pages"] == 0
        assert_nothing_held(llm)


def test_caching_off_copies_every_prompt_page():
    with make_llm(enable_prefix_caching=False) as llm:
        out = drive(llm, "c", PROMPT, SamplingParams(n=3, max_tokens=3, temperature=0.0))
        st = llm.stats()
        assert st["fork_shared_pages"] == 0 and st["fork_copied_pages"] == 3 * 2
        assert st["prefill_tokens_computed"] == 40
        assert len({tuple(c.token_ids) for c in out.outputs}) == 1
        assert_nothing_held(llm)


def test_request_id_of_a_sample_group_stays_reserved():
    with make_llm() as llm:
        eng = llm.engine
        eng.add_request("x", PROMPT, SamplingParams(n=2, max_tokens=2))
        with pytest.raises(ValueError, match="already in use"):
            eng.add_request("x#1", PROMPT, SamplingParams())
        with pytest.raises(ValueError, match="already in use"):
            eng.add_request("x", PROMPT, SamplingParams())
        while eng.has_unfinished_requests():
            eng.step()
        assert_nothing_held(llm)


def test_max_num_seqs_bounds_the_forked_samples():
    params = SamplingParams(n=4, max_tokens=5, seed=8, ignore_eos=True)
    with make_llm() as roomy:
        want = [c.token_ids for c in roomy.generate({"prompt_token_ids": PROMPT}, params)[0]
                .outputs]
    with make_llm(max_num_seqs=2) as llm:
        out = drive(llm, "m", PROMPT, params)
        st = llm.stats()
        # sample 1 forked beside the parent; 2 and 3 waited, then hit the 2 full pages
        # and computed the partial page's 8 tokens and their first token
        assert st["fork_copied_pages"] == 1 and st["fork_shared_pages"] == 2
        assert st["prefill_tokens_computed"] == 40 + 2 * 9
        assert [c.token_ids for c in out.outputs] == want
        assert_nothing_held(llm)


def test_seed_at_the_top_of_the_range_wraps_around():
    with make_llm() as llm:
        out = llm.generate({"prompt_token_ids": PROMPT},
                           SamplingParams(n=2, seed=2**64 - 1, max_tokens=4))[0]
        zero = llm.generate({"prompt_token_ids": PROMPT},
                            SamplingParams(seed=0, max_tokens=4))[0]
        assert out.outputs[1].token_ids == zero.outputs[0].token_ids


def test_prompt_logprobs_are_computed_once():
    with make_llm() as llm:
        out = llm.generate({"prompt_token_ids": PROMPT},
                           SamplingParams(n=3, max_tokens=2, prompt_logprobs=1))[0]
        assert len(out.prompt_logprobs) == 40 and out.prompt_logprobs[0] is None
        assert llm.stats()["prefill_tokens_computed"] == 40
        assert_nothing_held(llm)


@pytest.mark.parametrize("fail_at", [1, 3])  # the prefill step, a decode step
def test_a_failed_step_ends_every_sample_and_frees_its_pages(fail_at):
    with make_llm() as llm:
        eng = llm.engine
        real = eng.model.forward
        calls = {"n": 0}

        def flaky(batch, kv):
            calls["n"] += 1
            if calls["n"] == fail_at:
                raise RuntimeError("injected")
            return real(batch, kv)

        eng.model.forward = flaky
        eng.add_request("f", PROMPT, SamplingParams(n=4, max_tokens=8, seed=1))
        outs = []
        while eng.has_unfinished_requests():
            outs.extend(eng.step())
            check_invariants(eng.cache)
        assert len(outs) == fail_at and outs[-1].finished
        assert [c.finish_reason for c in outs[-1].outputs] == ["error"] * 4
        assert [c.num_tokens for c in outs[-1].outputs] == [fail_at - 1] * 4
        assert "injected" in outs[-1].error
        assert_nothing_held(llm)
        eng.model.forward = real
        again = llm.generate({"prompt_token_ids": PROMPT}, SamplingParams(n=2, max_tokens=2))
        assert [c.finish_reason for c in again[0].outputs] == ["length"] * 2
        assert_nothing_held(llm)
