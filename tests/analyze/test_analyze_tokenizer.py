import pytest

from prefixcache.analyze.encode import encode_requests
from prefixcache.analyze.logs import load_log
from prefixcache.analyze.textmap import char_offset
from prefixcache.analyze.tokenizer import TokenizerError, load_tokenizer
from helpers.data import shared_data

FOX = "Hello world, the quick brown fox."


def test_shared_tokenizers_give_their_known_ids():
    shared_data("tokenizers")
    assert load_tokenizer("qwen2").encode(FOX) == [9707, 1879, 11, 279, 3974, 13876, 38835, 13]
    assert load_tokenizer("gpt2").encode(FOX) == [15496, 995, 11, 262, 2068, 7586, 21831, 13]
    q = load_tokenizer("qwen2")
    assert q.encode("<|im_start|>user\nhi<|im_end|>") == [151644, 872, 198, 6023, 151645]


def test_approx_is_deterministic_and_chunks_long_words():
    a, b = load_tokenizer("approx"), load_tokenizer("approx")
    ids, offs = a.encode_offsets("an extraordinarily<|im_end|>")
    assert ids == b.encode("an extraordinarily<|im_end|>")
    # "an", " extraor" (8 bytes), "dinarily", then the marker as one token
    assert offs == [(0, 2), (2, 10), (10, 18), (18, 28)]
    assert a.decode(ids) == "an extraordinarily<|im_end|>"


def test_bytes_tokenizer():
    t = load_tokenizer("bytes")
    assert t.encode("é<|im_start|>") == [0xC3, 0xA9, 257]
    assert t.decode([0xC3, 0xA9, 257]) == "é<|im_start|>"


def test_unknown_tokenizer():
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer("/nonexistent/tok")


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
