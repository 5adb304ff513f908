"""Sampling through the engine: seeds, stops, max_tokens, logprobs, prompt logprobs."""
from __future__ import annotations

import math

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.sampling_params import ParamError
from tests.engine.conftest import TOL, prompt_ids


@pytest.fixture(scope="module")
def llm(llama):
    return LLM(llama.path, block_size=16, num_pages=256, shuffle_seed=5)


def gen(llm, prompt, **kw):
    return llm.generate([{"prompt_token_ids": prompt}], SamplingParams(**kw))[0]


def test_seed_reproduces_whatever_the_cache_holds(llm):
    prompt = prompt_ids(80, seed=21)
    kw = dict(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    llm.reset_prefix_cache()
    cold = gen(llm, prompt, **kw)
    warm = gen(llm, prompt, **kw)
    assert cold.num_cached_tokens == 0 and warm.num_cached_tokens == 64
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    # ... and inside a batch with other requests
    batch = llm.generate([{"prompt_token_ids": prompt_ids(30, seed=22)},
                          {"prompt_token_ids": prompt}], SamplingParams(**kw))
    assert batch[1].outputs[0].token_ids == cold.outputs[0].token_ids
    other = gen(llm, prompt, **dict(kw, seed=99))
    assert other.outputs[0].token_ids != cold.outputs[0].token_ids


def test_greedy_ignores_seed_and_temperature_zero_is_argmax(llm, llama):
    prompt = prompt_ids(33, seed=23)
    ref, _ = llama.greedy(prompt, 5)
    out = gen(llm, prompt, max_tokens=5, temperature=0.0, seed=3, ignore_eos=True)
    assert out.outputs[0].token_ids == ref


def test_top_k_one_is_greedy(llm, llama):
    prompt = prompt_ids(20, seed=24)
    ref, _ = llama.greedy(prompt, 5)
    out = gen(llm, prompt, max_tokens=5, temperature=5.0, top_k=1, ignore_eos=True)
    assert out.outputs[0].token_ids == ref


def test_stop_token_ids_and_max_tokens(llm, llama):
    prompt = prompt_ids(25, seed=25)
    ref, _ = llama.greedy(prompt, 8)
    out = gen(llm, prompt, max_tokens=8, temperature=0.0, stop_token_ids=[ref[3]], ignore_eos=True)
    first = ref.index(ref[3])
    assert out.outputs[0].token_ids == ref[:first + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == ref[3]
    out = gen(llm, prompt, max_tokens=3, temperature=0.0, ignore_eos=True)
    assert out.outputs[0].token_ids == ref[:3] and out.outputs[0].finish_reason == "length"


def test_eos_stops_unless_ignored(llama):
    prompt = prompt_ids(25, seed=25)
    ref, _ = llama.greedy(prompt, 8)
    llm = LLM(llama.path, block_size=16, num_pages=64)
    llm.engine.outputs.eos_token_ids = {ref[2]}
    out = gen(llm, prompt, max_tokens=8, temperature=0.0)
    assert out.outputs[0].token_ids == ref[:ref.index(ref[2]) + 1]
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason is None
    out = gen(llm, prompt, max_tokens=8, temperature=0.0, ignore_eos=True)
    assert out.outputs[0].token_ids == ref
    out = gen(llm, prompt, max_tokens=8, temperature=0.0, min_tokens=6)
    assert len(out.outputs[0].token_ids) >= 6


def test_stop_strings_cut_the_text():
    llm = LLM("builtin:tiny", num_pages=64)
    p = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    full = llm.generate(["abc"], p)[0].outputs[0].text
    assert len(full) >= 6
    stop = full[3:5]
    k = full.find(stop)
    out = llm.generate(["abc"], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                              stop=[stop]))[0].outputs[0]
    assert out.text == full[:k] and out.finish_reason == "stop" and out.stop_reason == stop
    out = llm.generate(["abc"], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True,
                                              stop=[stop], include_stop_str_in_output=True)
                       )[0].outputs[0]
    assert out.text == full[:k + len(stop)]


def test_logprobs_vllm_format(llm, llama):
    prompt = prompt_ids(40, seed=26)
    ref, lps = llama.greedy(prompt, 4)
    out = gen(llm, prompt, max_tokens=4, temperature=0.0, logprobs=3, ignore_eos=True)
    comp = out.outputs[0]
    assert len(comp.logprobs) == 4
    for tok, d, ref_lp in zip(comp.token_ids, comp.logprobs, lps):
        assert tok in d and d[tok].rank == 1
        assert len(d) == 3  # sampled token is the top one: no extra entry
        assert sorted(r.rank for r in d.values()) == [1, 2, 3]
        for t, lp in d.items():
            assert abs(lp.logprob - float(ref_lp[t])) < TOL
    assert math.isclose(comp.cumulative_logprob, sum(d[t].logprob for t, d in
                                                     zip(comp.token_ids, comp.logprobs)))


def test_prompt_logprobs_do_not_read_the_cache_but_publish(llm, llama):
    import torch
    prompt = prompt_ids(50, seed=27)
    llm.reset_prefix_cache()
    gen(llm, prompt, max_tokens=1, temperature=0.0)
    out = gen(llm, prompt, max_tokens=1, temperature=0.0, prompt_logprobs=2)
    assert out.num_cached_tokens == 0
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == 50
    with torch.no_grad():
        ref = torch.log_softmax(llama.model(torch.tensor([prompt])).logits[0].float(), -1)
    for pos in range(1, 50):
        d = out.prompt_logprobs[pos]
        assert abs(d[prompt[pos]].logprob - float(ref[pos - 1, prompt[pos]])) < TOL
    again = gen(llm, prompt, max_tokens=1, temperature=0.0)
    assert again.num_cached_tokens == 48


@pytest.mark.parametrize("kw,param", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(max_tokens=-1), "max_tokens"), (dict(n=0), "n"), (dict(n=129), "n"),
    (dict(n=3, best_of=2), "best_of"), (dict(best_of=129), "best_of"), (dict(n=True), "n"),
    (dict(stop=[f"x{i}" for i in range(17)]), "stop"),  # 17 distinct (duplicates fold)
    (dict(logprobs=21), "logprobs"), (dict(top_k=-2), "top_k"),
    (dict(temperature=float("inf")), "temperature"), (dict(top_p=float("nan")), "top_p"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty"),
    (dict(min_tokens=10, max_tokens=2), "min_tokens"),
])
def test_bad_params_name_the_parameter(kw, param):
    with pytest.raises(ParamError) as e:
        SamplingParams(**kw)
    assert e.value.param == param


def test_bad_prompts_are_rejected_and_engine_keeps_serving(llm):
    for prompt, param in [([], "prompt"), ([1, 10**6], "prompt"), ([-1], "prompt"),
                          (prompt_ids(1024, seed=1), "prompt")]:
        with pytest.raises(ParamError) as e:
            gen(llm, prompt, max_tokens=1)
        assert e.value.param == param
    with pytest.raises(ParamError) as e:
        gen(llm, prompt_ids(1000, seed=1), max_tokens=100)
    assert e.value.param == "max_tokens"
    assert gen(llm, [5, 6, 7], max_tokens=2, ignore_eos=True).outputs[0].finish_reason == "length"
    assert llm.stats()["pages_live"] == 0


def test_unreachable_min_tokens_is_rejected_at_admission(llm):
    # 256 pages * 16 = 4096 > max_position_embeddings 1024: the context is 1024 tokens.
    assert llm.engine.max_model_len == 1024
    for prompt_len, min_tokens in [(1000, 25), (10, 1015)]:
        with pytest.raises(ParamError) as e:
            gen(llm, prompt_ids(prompt_len, seed=3), min_tokens=min_tokens, max_tokens=None)
        assert e.value.param == "min_tokens"
        assert f"min_tokens={min_tokens}" in str(e.value)
    assert not llm.engine.has_unfinished_requests()
    out = gen(llm, prompt_ids(1000, seed=3), min_tokens=24, max_tokens=None)
    assert out.outputs[0].finish_reason == "length"
    assert len(out.outputs[0].token_ids) == 24  # the context is full after exactly 24
    assert llm.stats()["pages_live"] == 0
