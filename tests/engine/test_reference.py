"""Our paged engine against transformers on the same weights: cold and warm."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from tests.engine.conftest import CONFIGS, TOL, prompt_ids

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, logprobs=5, ignore_eos=True)


def assert_matches(out, ref_tokens, ref_lps):
    """Exact greedy tokens; sampled and top-5 logprobs within TOL of transformers."""
    comp = out.outputs[0]
    assert comp.token_ids == ref_tokens
    assert len(comp.logprobs) == len(ref_tokens)
    for step, (d, ref) in enumerate(zip(comp.logprobs, ref_lps)):
        for tok, lp in d.items():
            assert abs(lp.logprob - float(ref[tok])) < TOL, (step, tok)
        top = sorted(d.items(), key=lambda kv: -kv[1].logprob)
        assert top[0][0] == ref_tokens[step] and top[0][1].rank == 1


def make_llm(path, **kw):
    kw.setdefault("num_pages", 128)
    kw.setdefault("shuffle_seed", 7)  # non-contiguous pages
    return LLM(path, block_size=16, **kw)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cold_matches_transformers(hf_models, name):
    ref = hf_models[name]
    prompt = prompt_ids(45, seed=1)
    toks, lps = ref.greedy(prompt, GREEDY.max_tokens)
    llm = make_llm(ref.path)
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    assert out.num_cached_tokens == 0
    assert_matches(out, toks, lps)
    # Pages really are scattered: the shuffled pool did not hand out 0, 1, 2...
    assert llm.engine.cache.pool.free_pages()[:4] != [0, 1, 2, 3]


@pytest.mark.parametrize("shared_pages", [0, 1, 2, 5])
def test_warm_equals_cold_by_shared_pages(llama, shared_pages):
    base = prompt_ids(100, seed=2)
    second = base[:16 * shared_pages] + prompt_ids(100 - 16 * shared_pages, seed=3)
    toks, lps = llama.greedy(second, GREEDY.max_tokens)
    llm = make_llm(llama.path)
    llm.generate([{"prompt_token_ids": base}], GREEDY)
    out = llm.generate([{"prompt_token_ids": second}], GREEDY)[0]
    assert out.num_cached_tokens == 16 * shared_pages
    assert_matches(out, toks, lps)
    check_invariants(llm.engine.cache)


@pytest.mark.parametrize("hit_first", [True, False])
def test_mixed_batch_hits_and_misses(llama, hit_first):
    warm = prompt_ids(70, seed=4)
    cold = prompt_ids(53, seed=5)
    refs = {tuple(p): llama.greedy(p, GREEDY.max_tokens) for p in (warm, cold)}
    llm = make_llm(llama.path)
    llm.generate([{"prompt_token_ids": warm[:64] + [9]}], GREEDY)  # publishes 4 pages
    batch = [warm, cold] if hit_first else [cold, warm]
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], GREEDY)
    for p, out in zip(batch, outs):
        assert out.num_cached_tokens == (64 if p is warm else 0)
        assert_matches(out, *refs[tuple(p)])


def test_chunk_budget_inside_pages_after_hit(llama):
    prompt = prompt_ids(90, seed=6)
    toks, lps = llama.greedy(prompt, GREEDY.max_tokens)
    llm = make_llm(llama.path, max_num_batched_tokens=24)
    llm.generate([{"prompt_token_ids": prompt[:32] + [5, 6]}], GREEDY)
    before = llm.stats()["steps"]
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    assert out.num_cached_tokens == 32
    assert_matches(out, toks, lps)
    # 58 new prompt tokens in chunks of 24 -> 3 prefill steps, then 5 decode steps.
    assert llm.stats()["steps"] - before == 3 + GREEDY.max_tokens - 1


def test_full_prompt_hit_at_page_multiple(llama):
    prompt = prompt_ids(32, seed=8)
    toks, lps = llama.greedy(prompt, GREEDY.max_tokens)
    llm = make_llm(llama.path)
    cached = []
    for _ in range(3):
        out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
        cached.append(out.num_cached_tokens)
        assert_matches(out, toks, lps)
    assert cached == [0, 16, 16]


def test_caching_off_never_hits(llama):
    prompt = prompt_ids(64, seed=9)
    llm = make_llm(llama.path, enable_prefix_caching=False)
    outs = [llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0] for _ in range(2)]
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert llm.stats()["prefill_tokens_computed"] == 128


def test_sliding_window_model_caches_exactly(tmp_path):
    """Mistral with an 8-token window: the model masks the window exactly, so prefix
    caching stays on and a warm run equals transformers."""
    import torch
    import transformers

    from tests.engine.conftest import BASE, HFModel

    torch.manual_seed(5)
    cfg = transformers.MistralConfig(**dict(BASE, sliding_window=8, tie_word_embeddings=False))
    model = transformers.MistralForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    model.save_pretrained(tmp_path / "swa")
    ref = HFModel(str(tmp_path / "swa"), model)
    prompt = prompt_ids(60, seed=10)
    toks, lps = ref.greedy(prompt, GREEDY.max_tokens)
    llm = make_llm(ref.path)
    assert llm.engine.cache.enable_prefix_caching
    llm.generate([{"prompt_token_ids": prompt}], GREEDY)
    out = llm.generate([{"prompt_token_ids": prompt}], GREEDY)[0]
    assert out.num_cached_tokens == 48
    assert_matches(out, toks, lps)
