"""Fitting workloads to the model's context: exact counts, the capping rule, the limit."""
from __future__ import annotations

import json

import pytest

from prefixcache.bench import fit
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.workloads import (
    BenchRequest,
    conversation_requests,
    shared_prefix_requests,
)


class CharRenderer:
    """One token per character; chat messages are joined as ``role:content;``."""

    def render(self, req: BenchRequest) -> Prompt:
        if req.prompt is not None:
            text = req.prompt
        else:
            text = "".join(f"{m['role']}:{m['content']};" for m in req.messages)
        return Prompt(text, [ord(c) for c in text])


def render_all(reqs):
    r = CharRenderer()
    return {q.id: r.render(q) for q in reqs}


def test_shared_prefix_groups_are_capped_with_one_cut_each():
    systems = [("long", "L" * 100), ("short", "S" * 10)]
    questions = ["q" * 5, "q" * 9]
    reqs = shared_prefix_requests(systems, questions, 2, seed=0, max_tokens=4)
    prompts = render_all(reqs)
    # "system:" + 100 + ";user:" + 9 + ";" = 123 tokens + 4 out for the longest
    kept, kprompts, rep = fit.fit_workload(reqs, prompts, CharRenderer(), 80)
    assert rep.to_dict() == {"max_model_len": 80, "built": 4, "reserve": 0, "capped": 2,
                             "skipped": 0}
    assert [r.id for r in kept] == [r.id for r in reqs]  # same order, nothing dropped
    long = [r for r in kept if r.group == "long"]
    # one cut for the group: the longest member (9-char question) ends exactly at the limit
    cut = {r.messages[0]["content"] for r in long}
    assert cut == {"L" * (80 - 4 - len("system:;user:;") - 9)}
    assert max(len(kprompts[r.id].token_ids) + r.max_tokens for r in long) == 80
    assert all(r.extra["capped_system_chars"] == 53 for r in long)
    short = [r for r in kept if r.group == "short"]
    assert all(r.messages[0]["content"] == "S" * 10 and "capped_system_chars" not in r.extra
               for r in short)
    # the inputs are untouched
    assert all(r.messages[0]["content"] in ("L" * 100, "S" * 10) for r in reqs)
    assert kprompts == {r.id: CharRenderer().render(r) for r in kept}


def test_sessions_lose_the_first_turn_that_does_not_fit_and_all_after_it():
    msgs = [{"role": "user", "content": "u" * 10}, {"role": "assistant", "content": "a" * 10},
            {"role": "user", "content": "u" * 10}, {"role": "assistant", "content": "a" * 10},
            {"role": "user", "content": "u" * 10}, {"role": "assistant", "content": "a" * 10}]
    reqs = conversation_requests("s", msgs, max_tokens=2) + [
        BenchRequest(id="p", session="p", prompt="x" * 20, max_tokens=2)]
    prompts = render_all(reqs)
    sizes = [len(prompts[r.id].token_ids) for r in reqs]
    assert sizes == [16, 53, 90, 20]
    kept, _, rep = fit.fit_workload(reqs, prompts, CharRenderer(), 60)
    assert [r.id for r in kept] == ["s#0", "s#1", "p"]
    assert (rep.capped, rep.skipped, rep.built) == (0, 1, 4)
    kept, _, rep = fit.fit_workload(reqs, prompts, CharRenderer(), 18)
    assert [r.id for r in kept] == ["s#0"] and rep.skipped == 3
    # exactly at the limit fits: prompt + max_tokens == max_model_len
    assert [r.id for r in fit.fit_workload(reqs, prompts, CharRenderer(), 22)[0]] == ["s#0", "p"]
    # a reserve (the BOS a server adds) counts against the limit
    kept, _, rep = fit.fit_workload(reqs, prompts, CharRenderer(), 22, reserve=1)
    assert [r.id for r in kept] == ["s#0"] and (rep.reserve, rep.skipped) == (1, 3)


def test_a_question_too_long_alone_is_skipped_and_the_next_request_becomes_cold():
    reqs = shared_prefix_requests([("g", "G" * 50)], ["q" * 60, "q" * 2, "q" * 3], 3, seed=0,
                                  max_tokens=1, shuffle=False)
    assert [r.warm_expected for r in reqs] == [False, True, True]
    kept, _, rep = fit.fit_workload(reqs, render_all(reqs), CharRenderer(), 40)
    assert [r.id for r in kept] == ["g/1", "g/2"]
    assert (rep.capped, rep.skipped) == (2, 1)
    assert [r.warm_expected for r in kept] == [False, True]
    assert reqs[1].warm_expected is True  # a copy was relabelled, not the input
    assert {r.messages[0]["content"] for r in kept} == {"G" * (40 - 1 - 14 - 3)}
    # when the others fit uncut, only the one that cannot fit goes
    kept, _, rep = fit.fit_workload(reqs, render_all(reqs), CharRenderer(), 70)
    assert [r.id for r in kept] == ["g/1", "g/2"] and (rep.capped, rep.skipped) == (0, 1)
    assert kept[1] is reqs[2] and kept[0].messages == reqs[1].messages


def test_nothing_fits_and_bad_limits():
    reqs = [BenchRequest(id="p", session="p", prompt="x" * 20, max_tokens=2)]
    kept, prompts, rep = fit.fit_workload(reqs, render_all(reqs), CharRenderer(), 10)
    assert kept == [] and prompts == {} and rep.skipped == 1
    assert "0 capped" in rep.describe() and "1 skipped" in rep.describe()
    with pytest.raises(ValueError, match="max_model_len"):
        fit.fit_workload(reqs, render_all(reqs), CharRenderer(), 1)
    with pytest.raises(ValueError, match="reserve"):
        fit.fit_workload(reqs, render_all(reqs), CharRenderer(), 10, reserve=-1)


def test_the_reserve_is_what_the_tokenizer_adds_to_a_text():
    from prefixcache.model.builtin import tiny_tokenizer

    class NoSpecials:
        def encode(self, text, add_special_tokens=True):
            return [ord(c) for c in text]

    assert fit.special_tokens_added(tiny_tokenizer()) == 1  # its BOS
    assert fit.special_tokens_added(NoSpecials()) == 0
    assert fit.special_tokens_added(None) == 0


def test_the_limit_is_the_models_own(tmp_path):
    assert fit.model_max_len("builtin:tiny", None) == 4096
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 100,
           "max_position_embeddings": 8192}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert fit.model_max_len(str(tmp_path), tmp_path) == 8192


def test_the_report_describes_the_model_from_its_config(tmp_path, monkeypatch):
    from prefixcache.bench.runner import describe_model
    from prefixcache.model.gguf_cache import FORMAT_VERSION

    monkeypatch.setenv("PREFIXCACHE_CACHE_DIR", str(tmp_path))

    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": 100, "max_position_embeddings": 2048,
           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert describe_model(str(tmp_path), tmp_path) == (
        "LlamaForCausalLM, 3 layers, hidden 64, 4/2 heads, 128 MLP, vocab 100, context 4096")
    assert describe_model("builtin:tiny", None) == ""
    gguf_entry = tmp_path / "gguf" / f"abc-v{FORMAT_VERSION}"  # an entry of the GGUF cache
    gguf_entry.mkdir(parents=True)
    (gguf_entry / "config.json").write_text(json.dumps(cfg))
    assert describe_model("x.gguf", gguf_entry).endswith(
        "; GGUF weights dequantized to float32 (the copy every peer reads)")
