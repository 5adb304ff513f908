"""Prompts to tokens: the segment cache and token -> character offsets."""
import pytest

from helpers.data import shared_data
from prefixcache.analyze.encode import encode_requests
from prefixcache.analyze.logs import load_log
from prefixcache.analyze.textmap import char_offset
from prefixcache.text.loading import load_tokenizer


@pytest.mark.parametrize("spec", ["qwen2", "gpt2"])
def test_segment_cache_matches_whole_prompt_tokenization(spec):
    """Per-message tokenization reused across calls equals tokenizing each whole
    prompt, on a real agent trajectory."""
    tok = load_tokenizer(str(shared_data("tokenizers") / spec))
    reqs = load_log(shared_data("agent_trajectories") / "mini-swe-agent/tests/"
                    "github_issue.traj.json")
    trs, info = encode_requests(reqs, tok, template="builtin")
    assert info.segment_cache
    for tr in trs:
        assert tr.prompt_ids == tok.encode(tr.prompt_text)


def test_char_offsets_of_tokens():
    tok = load_tokenizer(str(shared_data("tokenizers") / "qwen2"))
    reqs = load_log(shared_data("agent_trajectories") / "mini-swe-agent/tests/"
                    "local.traj.json")
    for template in ("builtin", "auto"):  # segmented, and qwen2's own template
        (tr, _), _ = encode_requests(reqs, tok, template=template)
        _check_offsets(tok, tr)


def _check_offsets(tok, tr):
    _, offs = tok.encode_offsets(tr.prompt_text)
    for k in (0, 1, 5, tr.boundaries[0], tr.boundaries[0] + 3, len(tr.prompt_ids) - 1):
        assert char_offset(tok, tr, k) == offs[k][0]
