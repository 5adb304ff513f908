"""`prefixcache generate` and `prefixcache demo` on the built-in model."""
from __future__ import annotations

import json

from prefixcache import LLM, SamplingParams
from prefixcache.cli import main


def test_generate_json_matches_the_offline_api(capsys):
    assert main(["generate", "--json", "--max-tokens", "6", "Hello there", "Hello there!"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    ref = LLM("builtin:tiny").generate(["Hello there", "Hello there!"],
                                      SamplingParams(max_tokens=6, temperature=0.0))
    assert [x["token_ids"] for x in lines] == [r.outputs[0].token_ids for r in ref]
    assert [x["prompt_tokens"] for x in lines] == [12, 13]  # <bos> + 11 / 12 bytes
    assert all(x["finish_reason"] in ("stop", "length") for x in lines)


def test_demo_shows_hits_and_one_prefill_for_the_burst(capsys):
    assert main(["demo", "--prefix-repeat", "2", "--burst", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # undo rich's line wrapping
    assert "hit rate" in out and "warm 7" in out
    # 520-token prompts: the leader computes 520, each follower only its last 8 tokens
    assert "burst of 3 identical cold requests (520 tokens each): 536 prefill tokens" in out
