"""Work counts, followers, preemption, abort and failed steps through the engine."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from prefixcache.sampling_params import ParamError
from tests.engine.conftest import prompt_ids

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def make_llm(path, **kw):
    kw.setdefault("num_pages", 256)
    kw.setdefault("shuffle_seed", 3)
    return LLM(path, block_size=16, **kw)


def no_leak(llm):
    s = llm.stats()
    check_invariants(llm.engine.cache)
    assert s["pages_live"] == 0
    assert s["pages_free"] + s["pages_cached"] == s["pages_total"]
    assert not llm.engine.cache.tables and len(llm.engine.cache.inflight) == 0


@pytest.mark.parametrize("budget", [2048, 100])
def test_identical_cold_requests_pay_one_prefill(llama, budget):
    prompt = prompt_ids(512, seed=11)
    ref = make_llm(llama.path).generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    llm = make_llm(llama.path, max_num_batched_tokens=budget)
    outs = llm.generate([{"prompt_token_ids": prompt}] * 4, GREEDY)
    s = llm.stats()
    assert s["prefill_tokens_computed"] <= 512 + 4 * 16
    # The leader computes 512; each follower recomputes only its last page (16 tokens).
    assert s["prefill_tokens_computed"] == 512 + 3 * 16
    for o in outs:
        assert o.outputs[0].token_ids == ref.outputs[0].token_ids
    assert sorted(o.num_cached_tokens for o in outs) == [0, 496, 496, 496]
    assert s["inflight_hits"] == 3 * 496
    no_leak(llm)


def test_preemption_recomputes_and_matches_cold(llama):
    a, b = prompt_ids(150, seed=12), prompt_ids(150, seed=13)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    ref = make_llm(llama.path).generate([{"prompt_token_ids": p} for p in (a, b)], params)
    # 20 pages = 320 tokens: both 150-token prompts are admitted (10 pages each), but
    # both cannot grow to 190 tokens (12 pages each): decoding preempts the later one.
    llm = make_llm(llama.path, num_pages=20)
    outs = llm.generate([{"prompt_token_ids": p} for p in (a, b)], params)
    assert llm.stats()["num_preemptions"] >= 1
    for o, r in zip(outs, ref):
        assert o.outputs[0].token_ids == r.outputs[0].token_ids
        assert o.outputs[0].finish_reason == "length"
    no_leak(llm)


def test_abort_frees_pages_and_wakes_followers(llama):
    prompt = prompt_ids(300, seed=14)
    llm = make_llm(llama.path, max_num_batched_tokens=64)
    eng = llm.engine
    eng.add_request("leader", prompt, GREEDY)
    eng.step()  # leader computes its first 64 tokens, 4 pages published
    eng.add_request("follower", prompt, GREEDY)
    eng.step()  # leader computes tokens 64-128; the follower takes 4 pages and waits
    follower = eng.requests["follower"]
    assert follower.page_table.num_computed_tokens == 64
    assert llm.stats()["prefill_tokens_computed"] == 128
    eng.step()  # the follower takes pages 4-7 as published by the leader's last step
    assert follower.page_table.num_cached_tokens == 128
    assert follower.page_table.num_inflight_hit_tokens == 64
    assert llm.stats()["prefill_tokens_computed"] == 192
    eng.abort_request("leader")
    outs = []
    while eng.has_unfinished_requests():
        outs += eng.step()
    done = [o for o in outs if o.finished]
    assert [o.request_id for o in done] == ["leader", "follower"]
    assert done[0].outputs[0].finish_reason == "abort"
    ref = make_llm(llama.path).generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    assert done[1].outputs[0].token_ids == ref.outputs[0].token_ids
    no_leak(llm)


def test_failed_step_publishes_nothing_and_engine_keeps_serving(llama):
    prompt = prompt_ids(100, seed=15)
    llm = make_llm(llama.path)
    eng = llm.engine
    real = eng.model.forward
    calls = {"n": 0}

    def flaky(batch, kv):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected")
        return real(batch, kv)

    eng.model.forward = flaky
    eng.add_request("r1", prompt, GREEDY)
    outs = eng.step()
    assert outs[0].finished and outs[0].outputs[0].finish_reason == "error"
    assert "injected" in outs[0].error
    s = llm.stats()
    assert s["published_pages"] == 0 and s["failed_steps"] == 1
    no_leak(llm)
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    assert out.num_cached_tokens == 0 and out.outputs[0].finish_reason == "length"
    no_leak(llm)


def test_decode_pages_publish_for_next_turn(llama):
    prompt = prompt_ids(40, seed=16)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    llm = make_llm(llama.path)
    first = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    turn2 = prompt + first.outputs[0].token_ids + prompt_ids(10, seed=17)
    out = llm.generate([{"prompt_token_ids": turn2}], GREEDY)[0]
    # 40 prompt + 30 generated: KV of the first 69 tokens exists, 4 full pages = 64.
    assert out.num_cached_tokens == 64


def test_text_and_chat_without_a_tokenizer_name_the_parameter(llama):
    llm = make_llm(llama.path)  # the saved test model has weights and config, no tokenizer
    assert llm.tokenizer is None
    with pytest.raises(ParamError) as e:
        llm.chat([{"role": "user", "content": "hi"}])
    assert e.value.param == "messages"
    with pytest.raises(ParamError) as e:
        llm.generate(["hi"])
    assert e.value.param == "prompt"
    assert llm.engine.requests == {}
    no_leak(llm)


def test_request_table_is_its_page_table_until_it_is_removed(llama):
    llm = make_llm(llama.path)
    req = llm.engine.add_request("A", prompt_ids(40, seed=2), GREEDY)
    assert req.page_table is not None and req.table is req.page_table
    assert req.table.token_ids == req.all_token_ids
    assert llm.engine.abort_request("A")
    assert req.page_table is None
    with pytest.raises(RuntimeError, match="request A holds no page table"):
        _ = req.table
    no_leak(llm)
