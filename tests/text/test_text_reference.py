"""The shared tokenizers against transformers: the same ids on a mixed-script text, through
both backends (transformers and a bare ``tokenizer.json``), and the same chat rendering."""
from __future__ import annotations

import pytest

from helpers.data import shared_data
from prefixcache.text.hf_tokenizer import HFTokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer
from prefixcache.text.loading import load_tokenizer

MIXED = ("Zürich 🌍 naïve café — 東京タワー! Привет, мир. مرحبا 123.45\n"
         "\tcode: x=1; // ok")
# transformers 5.24's ids of MIXED (AutoTokenizer of the shared Qwen2 folder)
QWEN2_MIXED = [57, 5186, 713, 11162, 234, 235, 94880, 586, 51950, 1959, 60596, 109, 46553,
               46207, 125980, 0, 79484, 26991, 8178, 11, 137144, 13, 23364, 126860, 124671,
               220, 16, 17, 18, 13, 19, 20, 198, 43343, 25, 856, 28, 16, 26, 442, 5394]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": MIXED},
        {"role": "assistant", "content": "Hallo!"}, {"role": "user", "content": "再见"}]


@pytest.fixture(scope="module")
def qwen2():
    shared_data("tokenizers")  # skips (fails under CI=true) when the shared data is absent
    tok = load_tokenizer("qwen2")
    assert isinstance(tok, HFTokenizer)  # vocab.json + merges.txt: transformers reads it
    return tok


@pytest.fixture(scope="module")
def qwen2_json(qwen2, tmp_path_factory):
    """The same tokenizer saved as tokenizer.json and read by the ``tokenizers`` library."""
    d = tmp_path_factory.mktemp("qwen2-json")
    qwen2._tok.save_pretrained(str(d))
    tok = load_tokenizer(str(d))
    assert isinstance(tok, JSONTokenizer)
    return tok


def test_gpt2_ids_equal_transformers(shared_data_path):
    from transformers import PreTrainedTokenizerFast

    file = shared_data_path("tokenizers") / "gpt2" / "tokenizer.json"
    ref = PreTrainedTokenizerFast(tokenizer_file=str(file))
    tok = load_tokenizer("gpt2")
    assert isinstance(tok, JSONTokenizer)
    ids = tok.encode(MIXED)
    assert ids == ref.encode(MIXED) and len(ids) == 50
    assert tok.decode(ids) == MIXED == ref.decode(ids)


def test_qwen2_ids_equal_transformers_through_both_backends(qwen2, qwen2_json):
    assert qwen2.encode(MIXED) == QWEN2_MIXED == qwen2_json.encode(MIXED)
    texts = [MIXED, "<|im_start|>user\nhi<|im_end|>", ""]
    assert qwen2.encode_batch(texts) == qwen2_json.encode_batch(texts) == \
        [QWEN2_MIXED, [151644, 872, 198, 6023, 151645], []]
    assert qwen2.decode(QWEN2_MIXED) == MIXED == qwen2_json.decode(QWEN2_MIXED)
    assert set(qwen2.all_special_ids) >= {151643, 151644, 151645}
    assert qwen2_json.all_special_ids == qwen2.all_special_ids


def test_offsets_cover_the_text(qwen2, qwen2_json):
    for tok in (qwen2, qwen2_json):
        ids, offs = tok.encode_offsets(MIXED)
        assert ids == QWEN2_MIXED and len(offs) == len(ids)
        assert offs[0][0] == 0 and offs[-1][1] == len(MIXED)
        assert all(a <= b for a, b in offs)
        assert [a for a, _ in offs] == sorted(a for a, _ in offs)
        assert MIXED[offs[-2][0]:offs[-2][1]] == " //"
    assert qwen2.encode_offsets(MIXED) == qwen2_json.encode_offsets(MIXED)


@pytest.mark.parametrize("gen", [True, False])
def test_qwen2_template_renders_like_transformers(qwen2, qwen2_json, gen):
    ref = qwen2._tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=gen)
    assert qwen2.render_chat(CHAT, add_generation_prompt=gen) == ref
    # the tokenizer.json backend renders the template with our renderer
    assert qwen2_json.chat_template == qwen2.chat_template
    assert qwen2_json.render_chat(CHAT, add_generation_prompt=gen) == ref
    ids = qwen2_json.apply_chat_template(CHAT, add_generation_prompt=gen)
    assert ids == qwen2.encode(ref, add_special_tokens=False) == qwen2.apply_chat_template(
        CHAT, add_generation_prompt=gen)
    assert ids[:3] == [151644, 8948, 198]  # <|im_start|>system\n
