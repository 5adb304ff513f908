"""``LLMEngine.warmup``: one full-size step outside the scheduler before the first request.
It leaves no trace (every page free, no counter, no cache entry), changes no output, and
refuses to run once a request exists."""
from __future__ import annotations

import pytest

from prefixcache.cache.invariants import check_invariants
from prefixcache.config import EngineConfig
from prefixcache.engine.engine import LLMEngine
from prefixcache.sampling_params import SamplingParams
from tests.engine.conftest import prompt_ids

BS = 16


def engine(path: str, **kw) -> LLMEngine:
    return LLMEngine(EngineConfig(model=path, block_size=BS, num_pages=40, **kw))


def run(eng: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    out: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                out[o.request_id] = list(o.outputs[0].token_ids)
    return [out[f"r{i}"] for i in range(len(prompts))]


@pytest.mark.parametrize("budget,want", [(48, 48), (2048, 40 * BS - 1)])
def test_warmup_leaves_no_trace_and_changes_no_output(hf_models, budget, want):
    path = hf_models["llama"].path
    warm = engine(path, max_num_batched_tokens=budget)
    counters = dict(warm.counters)
    assert warm.warmup() == want          # the step budget, capped by the pool (640 slots)
    assert warm.counters == counters
    assert warm.cache.pool.num_free == 40 and warm.cache.pool.num_cached == 0
    assert warm.cache.pool.num_live == 0
    check_invariants(warm.cache)          # free pages only, nothing indexed or in flight
    cold = engine(path, max_num_batched_tokens=budget)
    prompts = [prompt_ids(70, seed=1), prompt_ids(70, seed=1)[:50] + prompt_ids(9, seed=2)]
    assert run(warm, prompts) == run(cold, prompts)
    assert warm.counters == cold.counters


def test_warmup_refuses_once_a_request_exists(hf_models):
    eng = engine(hf_models["llama"].path)
    eng.add_request("a", prompt_ids(20, seed=3), SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="before the first request"):
        eng.warmup()


def test_runner_warmup_names_what_it_needs(hf_models):
    eng = engine(hf_models["llama"].path)
    with pytest.raises(ValueError, match="num_tokens"):
        eng.runner.warmup(0, [0, 1])
    with pytest.raises(ValueError, match="3 pages"):
        eng.runner.warmup(40, [0, 1])   # 41 slots need 3 pages of 16


def test_runner_warmup_writes_its_tokens_into_the_given_pages_only(hf_models):
    eng = engine(hf_models["llama"].path)
    eng.runner.warmup(40, [5, 9, 2, 7])   # 41 slots: pages 5 and 9 whole, 9 slots of page 2
    for kv in (*eng.runner.kv.k, *eng.runner.kv.v):
        written = kv.flatten(2).abs().sum(-1) != 0          # [page, slot]
        assert written[5].all() and written[9].all()
        assert written[2].tolist() == [True] * 9 + [False] * 7
        written[[5, 9, 2]] = False
        assert not written.any()                            # page 7 and the rest untouched
