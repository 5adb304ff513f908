"""Penalties as vLLM and transformers define them: the repetition penalty covers the
prompt's tokens and the generated ones; presence and frequency penalties count only
generated tokens. Checked against transformers' ``generate`` on the same weights, cold,
warm (the prompt's pages cached) and without prefix caching."""
from __future__ import annotations

import pytest
import torch

from prefixcache import LLM, SamplingParams
from prefixcache.model.sampler import PenaltyCounts, apply_penalties
from tests.engine.conftest import prompt_ids

N = 16
PENALTY = 1.8


def hf_generate(hf, prompt: list[int], **kw) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=N, min_new_tokens=N,
                          do_sample=False, pad_token_id=0, **kw)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_repetition_penalty_matches_transformers(llama, caching):
    prompt = prompt_ids(70, seed=53)
    ref = hf_generate(llama.model, prompt, repetition_penalty=PENALTY)
    assert ref != hf_generate(llama.model, prompt)  # the penalty matters here...
    assert set(prompt) & set(hf_generate(llama.model, prompt))  # ...on prompt tokens too
    llm = LLM(llama.path, block_size=16, num_pages=256, shuffle_seed=2,
              enable_prefix_caching=caching)
    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True,
                            repetition_penalty=PENALTY)
    cold, warm = (llm.generate([{"prompt_token_ids": prompt}], params)[0] for _ in range(2))
    assert cold.num_cached_tokens == 0
    assert warm.num_cached_tokens == (64 if caching else 0)
    assert cold.outputs[0].token_ids == ref
    assert warm.outputs[0].token_ids == ref


def test_presence_and_frequency_penalties_ignore_the_prompt():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    counts = PenaltyCounts([0, 1], 4, "cpu", with_prompt=True)
    counts.update([3, 3, 2])
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, counts, p)
    # tokens 0 and 1 are only in the prompt: untouched; 3 twice, 2 once
    assert out.tolist() == [2.0, -1.0, 0.5 - 0.25 - 0.5, 3.0 - 0.5 - 0.5]
    rep = apply_penalties(logits, counts, SamplingParams(repetition_penalty=2.0))
    assert rep.tolist() == [1.0, -2.0, 0.25, 1.5]  # prompt and generated tokens alike
    assert apply_penalties(logits, counts, SamplingParams()) is logits
