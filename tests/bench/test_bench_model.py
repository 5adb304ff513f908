"""The benchmark model directory (a tiny geometry here) and prompt rendering with it."""
from __future__ import annotations

import json

import pytest

from helpers.data import shared_data
from prefixcache.bench.bench_model import (
    CHAT_TEMPLATE,
    BenchModelSpec,
    count_parameters,
    ensure_bench_model,
)
from prefixcache.bench.prompts import TokenizerRenderer, label_warm_by_overlap
from prefixcache.bench.workloads import BenchRequest, conversation_requests

TINY = BenchModelSpec(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, intermediate_size=64, max_position_embeddings=4096)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    tok = shared_data("tokenizers") / "gpt2" / "tokenizer.json"
    return ensure_bench_model(tmp_path_factory.mktemp("m") / "bench", TINY, tokenizer_json=tok,
                              quiet=True)


def test_model_dir_matches_the_tokenizer(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == 50257
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_key_value_heads"]) == (32, 1, 1)
    assert cfg["eos_token_id"] == 50256 and cfg["rope_theta"] == 10000.0
    assert not cfg["tie_word_embeddings"]
    tc = json.loads((tiny_dir / "tokenizer_config.json").read_text())
    assert tc["tokenizer_class"] == "GPT2TokenizerFast" and tc["chat_template"] == CHAT_TEMPLATE
    assert (tiny_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    # embedding + lm_head (2 x 50257 x 32) + one layer + norms
    layer = 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 64 + 2 * 32
    assert count_parameters(tiny_dir) == 2 * 50257 * 32 + layer + 32
    stamp = (tiny_dir / "bench_model.json").stat().st_mtime_ns
    assert ensure_bench_model(tiny_dir, TINY) == tiny_dir  # reused, not rebuilt
    assert (tiny_dir / "bench_model.json").stat().st_mtime_ns == stamp


def test_rendering_is_stable_across_turns(tiny_dir):
    r = TokenizerRenderer.from_dir(tiny_dir)
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello world"},
            {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Again"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "42"},
            {"role": "assistant", "content": "42."}]
    reqs = conversation_requests("s", msgs, max_tokens=1)
    texts = [r.render(q).text for q in reqs]
    assert texts[0] == ("<|system|>\nBe terse.\n<|end|>\n<|user|>\nHello world\n<|end|>\n"
                        "<|assistant|>\n")
    assert texts[2].endswith("<|assistant|>\n\n<tool_call>f {}</tool_call>\n<|end|>\n"
                             "<|tool|>\n42\n<|end|>\n<|assistant|>\n")
    for a, b in zip(texts, texts[1:]):
        assert b.startswith(a)  # each turn's prompt extends the previous one
    ids = [r.render(q).token_ids for q in reqs]
    assert ids[1][: len(ids[0])] == ids[0]
    plain = r.render(BenchRequest(id="x", session="x", prompt="Hello world"))
    assert plain.token_ids == [15496, 995]


def test_overlap_labels_for_unlabelled_requests():
    from prefixcache.bench.prompts import Prompt

    reqs = [BenchRequest(id=i, session=i, tenant=t)
            for i, t in (("a", None), ("b", None), ("c", "x"), ("d", None))]
    prompts = {"a": Prompt(None, [1] * 10), "b": Prompt(None, [1] * 8 + [2] * 4),
               "c": Prompt(None, [1] * 10), "d": Prompt(None, [3] * 10)}
    label_warm_by_overlap(reqs, prompts)
    assert [r.warm_expected for r in reqs] == [False, True, False, False]


def test_transformers_peer_serves_serially_with_queueing(tiny_dir):
    from prefixcache.bench.peers import PeerContext, make_peer
    from prefixcache.bench.prompts import Prompt

    peer = make_peer("transformers", "offline")
    peer.start(PeerContext(model=str(tiny_dir), model_dir=tiny_dir, threads=1, eos_token_id=50256))
    try:
        reqs = [BenchRequest(id=f"b{i}", session=f"b{i}", max_tokens=3, warm_expected=False)
                for i in range(3)]
        prompts = {r.id: Prompt(None, [15496, 995, 11, 262]) for r in reqs}
        run = peer.run("cold-burst", reqs, prompts, concurrency=3, salt="s")
    finally:
        peer.stop()
    res = sorted(run.results, key=lambda r: r.first_token_time)
    assert [r.output_tokens for r in res] == [3, 3, 3] and all(r.error is None for r in res)
    # all sent before the first was answered (ordering, not a wall-clock bound)
    assert max(r.send_time for r in res) <= res[0].first_token_time
    assert res[0].ttft < res[1].ttft < res[2].ttft  # served one after another
    assert run.prefill_tokens_computed == 12 and run.concurrency is None
