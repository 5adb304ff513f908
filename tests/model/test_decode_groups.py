"""Decode rows are grouped by context length: one long context does not make short ones
gather its page count, and every grouping gives transformers' logits."""
from __future__ import annotations

import pytest
import torch

from prefixcache.model.attention import PAD_SLACK, decode_groups, plan_attention
from prefixcache.model.config import ModelConfig
from prefixcache.model.forward_batch import SeqChunk
from prefixcache.model.weights import load_hf_weights
from tests.helpers.hf_models import hf_logits, make_hf_model
from tests.helpers.paged import PagedRunner, Seq, cpu_model


def chunk(row: int, ctx: int, bs: int = 16) -> SeqChunk:
    return SeqChunk(row, 1, ctx, torch.arange(-(-ctx // bs)))


def test_one_long_context_is_grouped_apart_from_short_ones():
    seqs = [chunk(0, 8192)] + [chunk(i, 500) for i in range(1, 8)]
    groups = decode_groups(seqs)
    assert [[s.q_start for s in g] for g in groups] == [[0], [1, 2, 3, 4, 5, 6, 7]]
    plan = plan_attention(seqs, None, torch.device("cpu"), 16)
    assert plan.decode_pages_gathered == 512 + 7 * 32  # not 8 * 512
    assert plan.seqs == []


def test_similar_lengths_share_one_group_within_the_slack():
    assert PAD_SLACK == 0.25
    # 10 and 8 pages: 2 * 10 = 20 <= 1.25 * 18 -> together; then 5 pages: 30 > 1.25 * 23
    seqs = [chunk(0, 150), chunk(1, 128), chunk(2, 80), chunk(3, 70)]
    assert [[s.q_start for s in g] for g in decode_groups(seqs)] == [[0, 1], [2, 3]]
    same = [chunk(i, 1000) for i in range(6)]
    assert len(decode_groups(same)) == 1


def test_mixed_length_decode_step_matches_transformers():
    hf = make_hf_model("llama")
    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    m = cpu_model(cfg)
    load_hf_weights(m, hf.state_dict().__getitem__)
    runner = PagedRunner(m, num_pages=64)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (150, 9, 12, 140)]
    seqs = [Seq() for _ in prompts]
    for s, p in zip(seqs, prompts):
        runner.prefill(s, p)
    new = [[3], [4], [5], [6]]
    got = runner.step(list(zip(seqs, new)))
    assert len(decode_groups([chunk(0, 151), chunk(1, 10), chunk(2, 13), chunk(3, 141)])) == 2
    for logits, p, n in zip(got, prompts, new):
        torch.testing.assert_close(logits, hf_logits(hf, p + n)[-1], atol=2e-4, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_grouped_decode_matches_cpu():
    hf = make_hf_model("llama")
    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    out = {}
    for dev in ("cpu", "cuda"):
        m = cpu_model(cfg, dev)
        load_hf_weights(m, hf.state_dict().__getitem__)
        runner = PagedRunner(m, num_pages=64)
        seqs = [Seq() for _ in range(3)]
        for s, n in zip(seqs, (150, 9, 40)):
            runner.prefill(s, list(range(1, n + 1)))
        out[dev] = torch.stack(runner.step([(s, [7]) for s in seqs]))
    torch.testing.assert_close(out["cuda"].cpu(), out["cpu"], atol=1e-3, rtol=0)


def test_layers_and_steps_gather_into_one_reused_scratch_buffer():
    hf = make_hf_model("llama")
    cfg = ModelConfig.from_dict({**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    m = cpu_model(cfg, backend="torch")  # the gathering path (CUDA's)
    load_hf_weights(m, hf.state_dict().__getitem__)
    runner = PagedRunner(m, num_pages=64)
    seqs = [Seq(), Seq()]
    prompts = [list(range(1, 51)), list(range(2, 42))]  # 4 and 3 pages
    for s, p in zip(seqs, prompts):
        runner.prefill(s, p)
    allocs = runner.kv.num_scratch_allocs  # the prefills attend over fresh keys only
    for t in range(12):  # contexts up to 62 and 52: 2 x 4 padded pages, one buffer
        runner.step([(s, [t + 3]) for s in seqs])
    assert runner.kv.num_scratch_allocs == allocs + 1
    assert runner.kv._scratch is not None and runner.kv._scratch.shape[1] == 8
    # and the last step still equals transformers
    last = runner.step([(s, [9]) for s in seqs])
    for s, got in zip(seqs, last):
        torch.testing.assert_close(got, hf_logits(hf, s.tokens)[-1], atol=2e-4, rtol=1e-4)
