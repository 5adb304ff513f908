"""`prefixcache generate` and `prefixcache demo` on the built-in model."""
from __future__ import annotations

import json

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cli import main
from prefixcache.sampling_params import ParamError


def test_generate_json_matches_the_offline_api(capsys):
    assert main(["generate", "--json", "--max-tokens", "6", "Hello there", "Hello there!"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    ref = LLM("builtin:tiny").generate(["Hello there", "Hello there!"],
                                      SamplingParams(max_tokens=6, temperature=0.0))
    assert [x["token_ids"] for x in lines] == [r.outputs[0].token_ids for r in ref]
    assert [x["prompt_tokens"] for x in lines] == [12, 13]  # <bos> + 11 / 12 bytes
    assert all(x["finish_reason"] in ("stop", "length") for x in lines)


def test_demo_shows_hits_and_one_prefill_for_the_burst(capsys):
    assert main(["demo", "--model", "builtin:tiny", "--burst", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert "hit rate" in out and "warm 5" in out and "How many items can one card hold? ->" in out
    # 1922-token prompts: the leader computes 1922, each follower only its last 2 tokens
    assert "burst of 3 identical cold requests (1922 tokens each): 1926 prefill tokens" in out


def test_user_errors_print_one_line_and_exit_2(capsys, tmp_path):
    assert main(["generate", "--max-tokens", "0", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("prefixcache generate: error: max_tokens: must be at least 1")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["generate", "--model", str(tmp_path / "missing"), "x"]) == 2
    assert str(tmp_path / "missing") in capsys.readouterr().err


def test_empty_text_prompt_and_kv_pool_limit_are_named():
    llm = LLM("builtin:tiny", num_pages=40, block_size=16, max_model_len=1024)
    with pytest.raises(ParamError) as e:
        llm.generate([""], SamplingParams(max_tokens=2))
    assert e.value.param == "prompt" and "empty" in str(e.value)
    with pytest.raises(ParamError) as e:
        llm.generate([{"prompt_token_ids": [5] * 700}], SamplingParams(max_tokens=2))
    assert "the KV pool allows 640 tokens (40 pages of 16 tokens" in str(e.value)
    assert llm.stats()["pages_live"] == 0
