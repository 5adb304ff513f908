"""The sampler's batched greedy path equals row-by-row picking; mixed steps keep each
row's own rule (greedy, penalised greedy, seeded sampling)."""
from __future__ import annotations

import torch

from prefixcache.model.sampler import PenaltyCounts, sample
from prefixcache.sampling_params import SamplingParams


def test_all_greedy_rows_take_the_argmax_of_each_row():
    logits = torch.full((4, 10), -1.0)
    logits[0, 3] = logits[1, 9] = logits[2, 0] = 5.0
    logits[3, 4] = logits[3, 6] = 2.0  # a tie: the first index, like torch.argmax of a row
    greedy = SamplingParams(temperature=0.0)
    tokens, lps = sample(logits, [greedy] * 4, [None] * 4, [None] * 4)
    assert tokens == [3, 9, 0, 4] and lps == [None] * 4
    assert sample(logits[:0], [], [], []) == ([], [])


def test_mixed_rows_keep_their_own_rule():
    logits = torch.zeros(3, 8)
    logits[:, 2] = 3.0
    logits[1, 5] = 3.5
    counts = PenaltyCounts([5], 8, "cpu", with_prompt=True)  # token 5 seen in the prompt
    counts.update([])
    greedy = SamplingParams(temperature=0.0)
    penalised = SamplingParams(temperature=0.0, repetition_penalty=2.0)  # 3.5 -> 1.75
    seeded = SamplingParams(temperature=1.0, top_k=1, seed=0, logprobs=1)
    tokens, lps = sample(logits, [greedy, penalised, seeded],
                         [None, None, torch.Generator().manual_seed(0)], [None, counts, None])
    assert tokens == [2, 2, 2]  # top_k=1 leaves one candidate
    assert lps[0] is None and lps[1] is None and lps[2] is not None
    assert lps[2].token_id == 2 and lps[2].rank == 1
