"""deterministic=True: cold and warm runs are bit-identical, whatever the batch."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from tests.engine.conftest import prompt_ids

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, logprobs=20, ignore_eos=True)


def make_llm(path, **kw):
    kw.setdefault("num_pages", 256)
    kw.setdefault("shuffle_seed", 9)
    return LLM(path, block_size=16, deterministic=True, **kw)


def signature(out):
    """Tokens and every returned logprob, as exact floats."""
    comp = out.outputs[0]
    return comp.token_ids, [sorted((t, lp.logprob) for t, lp in d.items()) for d in comp.logprobs]


def run(llm, prompts, params=PARAMS):
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params)


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_cold_warm_alone_batched_and_chunked_are_bit_identical(hf_models, name):
    path = hf_models[name].path
    prompt = prompt_ids(77, seed=41)
    cold = signature(run(make_llm(path), [prompt])[0])

    llm = make_llm(path)
    run(llm, [prompt[:64] + [3, 4]])
    warm = run(llm, [prompt])[0]
    assert warm.num_cached_tokens == 64
    assert signature(warm) == cold

    others = [prompt_ids(n, seed=42 + n) for n in (5, 50, 130)]
    mixed = run(make_llm(path), others[:2] + [prompt] + others[2:])
    assert signature(mixed[2]) == cold

    for budget in (7, 24, 2048):
        chunked = run(make_llm(path, max_num_batched_tokens=budget), [prompt])[0]
        assert signature(chunked) == cold, budget


def test_hit_on_decode_pages_is_bit_identical(llama):
    """A page filled during decode and hit by the next turn gives the same bits as
    prefilling those tokens cold."""
    prompt = prompt_ids(40, seed=43)
    llm = make_llm(llama.path)
    first = run(llm, [prompt], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))[0]
    turn2 = prompt + first.outputs[0].token_ids + prompt_ids(9, seed=44)
    warm = run(llm, [turn2])[0]
    assert warm.num_cached_tokens == 64  # two of the four pages were written by decode
    cold = run(make_llm(llama.path, enable_prefix_caching=False), [turn2])[0]
    assert signature(warm) == signature(cold)


def test_default_mode_is_close_but_deterministic_mode_is_exact(llama):
    prompt = prompt_ids(77, seed=45)
    sigs = {}
    for det in (False, True):
        llm = LLM(llama.path, block_size=16, num_pages=256, deterministic=det,
                  max_num_batched_tokens=24)
        cold = run(llm, [prompt])[0]
        warm = run(llm, [prompt])[0]
        sigs[det] = (signature(cold), signature(warm))
        assert cold.outputs[0].token_ids == warm.outputs[0].token_ids
    assert sigs[True][0] == sigs[True][1]
