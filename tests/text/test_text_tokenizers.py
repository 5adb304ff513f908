"""Tokenizers (byte-level, approx, tokenizer.json, transformers), their loading from a
model folder or a ``--tokenizer`` value, and streaming detokenization."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.data import shared_data
from prefixcache.model.builtin import BOS_ID, END_ID, EOS_ID, tiny_tokenizer
from prefixcache.text.chat_template import render_chat_template
from prefixcache.text.detokenizer import IncrementalDetokenizer
from prefixcache.text.hf_tokenizer import HFTokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer
from prefixcache.text.loading import TokenizerError, load_tokenizer, tokenizer_for_model

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)
BYTE = tiny_tokenizer()
FOX = "Hello world, the quick brown fox."


@given(TEXT)
def test_byte_tokenizer_roundtrips_any_utf8(text):
    ids = BYTE.encode(text)
    assert ids[0] == BOS_ID
    assert BYTE.decode(ids, skip_special_tokens=False) == "<bos>" + text
    assert BYTE.decode(BYTE.encode(text, add_special_tokens=False),
                       skip_special_tokens=False) == text


def test_byte_tokenizer_specials():
    ids = BYTE.encode("a<|user|>é", add_special_tokens=False)
    assert ids == [97, 259, 0xC3, 0xA9]
    assert BYTE.decode(ids) == "aé"
    assert BYTE.decode(ids, skip_special_tokens=False) == "a<|user|>é"
    assert BYTE.eos_token_ids == {EOS_ID, END_ID} and BYTE.bos_token_id == BOS_ID
    assert set(BYTE.all_special_ids) == set(range(256, 263))
    assert BYTE.vocab_size == 272
    assert BYTE.decode([270, 104, 105]) == "hi"  # padding ids decode to nothing
    assert BYTE.decode([0xE2, 0x82]) == "\ufffd"  # truncated UTF-8
    assert BYTE.decode_token(104) == "h" and BYTE.decode_token(END_ID) == "<|end|>"


def test_builtin_chat_template_renders():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": [{"type": "text", "text": "2+2?"}]}]
    text = BYTE.render_chat(msgs)
    assert text == ("<bos><|system|>Be brief.<|end|><|user|>Hi<|end|><|assistant|>Hello"
                    "<|end|><|user|>2+2?<|end|><|assistant|>")
    ids = BYTE.apply_chat_template(msgs)
    assert ids[:2] == [BOS_ID, 258] and ids[-1] == 260
    assert ids.count(BOS_ID) == 1  # the template writes BOS; encode adds none
    assert not BYTE.render_chat(msgs[:2], add_generation_prompt=False).endswith("<|assistant|>")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    assert '"name": "get_weather"' in BYTE.render_chat(msgs[1:2], tools=tools)


@settings(max_examples=60)
@given(TEXT, st.lists(st.integers(1, 4), min_size=1, max_size=40))
def test_incremental_detokenizer_bytes(text, cuts):
    ids = BYTE.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(BYTE, prompt_ids=BYTE.encode("ab"))
    deltas, i, k = [], 0, 0
    while i < len(ids):
        n = cuts[k % len(cuts)]
        deltas.append(detok.push(ids[i:i + n]))
        i, k = i + n, k + 1
    deltas.append(detok.flush())
    assert "".join(deltas) == text == detok.text
    assert all("\ufffd" not in d for d in deltas) or "\ufffd" in text


def test_incremental_detokenizer_holds_partial_characters():
    detok = IncrementalDetokenizer(BYTE)
    euro = "€".encode()
    assert detok.push([euro[0]]) == ""
    assert detok.push([euro[1]]) == ""
    assert detok.push([euro[2], ord("!")]) == "€!"
    assert detok.push([0xF0]) == ""
    assert detok.flush() == "\ufffd"  # the stream ended inside a character


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, shared_data_path):
    d = tmp_path_factory.mktemp("gpt2")
    shutil.copy(shared_data_path("tokenizers") / "gpt2" / "tokenizer.json", d)
    return d


def test_tokenizer_json_only_dir(gpt2_dir):
    tok = tokenizer_for_model(gpt2_dir, bos_token_id=None, eos_token_ids=(50256,))
    assert isinstance(tok, JSONTokenizer)
    ids = tok.encode("Hello world, the quick brown fox.")
    assert ids == [15496, 995, 11, 262, 2068, 7586, 21831, 13]
    assert tok.decode(ids) == "Hello world, the quick brown fox."
    assert tok.eos_token_ids == {50256} and tok.all_special_ids == [50256]
    assert tok.vocab_size == 50257
    assert tok.decode_token(995) == " world"
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "hi"}])


def test_incremental_detokenizer_byte_level_bpe(gpt2_dir):
    tok = tokenizer_for_model(gpt2_dir)
    text = "Zürich 🌍 naïve café — 東京タワー!"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.push([t]) for t in ids] + [detok.flush()]
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert deltas.count("") > 0  # multi-token characters were held back


@pytest.fixture(scope="module")
def qwen2(shared_data_path):
    return HFTokenizer(shared_data_path("tokenizers") / "qwen2")


def test_transformers_tokenizer_and_chat_template(qwen2):
    assert qwen2.encode("Hello world, the quick brown fox.") == [
        9707, 1879, 11, 279, 3974, 13876, 38835, 13]
    assert 151645 in qwen2.eos_token_ids  # <|im_end|>
    assert {151643, 151644, 151645} <= set(qwen2.all_special_ids)
    msgs = [{"role": "user", "content": "hi"}]
    ids = qwen2.apply_chat_template(msgs)
    assert ids[0] == 151644 and ids[-3:] == [151644, 77091, 198]  # <|im_start|>assistant\n
    # our Jinja environment renders the same text as transformers'
    assert render_chat_template(qwen2.chat_template, msgs, add_generation_prompt=True,
                                eos_token="<|im_end|>") == qwen2.render_chat(msgs)


def test_incremental_detokenizer_with_prompt_context(qwen2):
    prompt = qwen2.encode("The answer is")
    gen = qwen2.encode(" forty-two 🙂, surely.")
    detok = IncrementalDetokenizer(qwen2, prompt_ids=prompt)
    out = "".join(detok.push([t]) for t in gen) + detok.flush()
    assert out == " forty-two 🙂, surely."


# -- ``--tokenizer`` values (analyze) -------------------------------------------------------

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
    assert a.decode(ids, skip_special_tokens=False) == "an extraordinarily<|im_end|>"
    assert a.decode(ids) == "an extraordinarily"


def test_bytes_tokenizer():
    t = load_tokenizer("bytes")
    assert t.encode("é<|im_start|>") == [0xC3, 0xA9, 257]
    assert t.decode([0xC3, 0xA9, 257], skip_special_tokens=False) == "é<|im_start|>"
    ids, offs = t.encode_offsets("aé<|im_end|>")
    assert ids == [97, 0xC3, 0xA9, 258] and offs == [(0, 1), (1, 2), (1, 2), (2, 12)]


def test_unknown_tokenizer():
    with pytest.raises(TokenizerError, match="no such file"):
        load_tokenizer("/nonexistent/tok")


def test_byte_tokenizer_parameters_are_checked():
    from prefixcache.text.byte_tokenizer import ByteTokenizer

    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer(("<a>", "<b>"), vocab_size=257)
    with pytest.raises(ValueError, match="bos_token"):
        ByteTokenizer(("<a>",), bos_token="<s>")
    with pytest.raises(ValueError, match="eos_tokens"):
        ByteTokenizer(("<a>",), eos_tokens=("<a>", "</s>"))
    plain = ByteTokenizer(())
    assert plain.encode("hé") == [104, 0xC3, 0xA9] and plain.vocab_size == 256
    assert plain.bos_token_id is None and plain.all_special_ids == []
    ids, offs = BYTE.encode_offsets("a<|end|>")
    assert ids == [BOS_ID, 97, END_ID] and offs == [(0, 0), (0, 1), (1, 8)]


def test_folder_kinds_pick_their_backend(tmp_path, shared_data_path):
    """tokenizer.json -> the tokenizers library, with the folder's chat template and
    special-token strings; vocab.json + merges.txt -> transformers."""
    src = shared_data_path("tokenizers")
    d = tmp_path / "json"
    d.mkdir()
    shutil.copy(src / "gpt2" / "tokenizer.json", d)
    (d / "tokenizer_config.json").write_text(
        '{"eos_token": "<|endoftext|>", "chat_template": [{"name": "tool_use", '
        '"template": "T"}, {"name": "default", "template": "{{ eos_token }}D"}]}')
    tok = load_tokenizer(str(d))
    assert isinstance(tok, JSONTokenizer) and tok.name == "json"
    assert tok.chat_template == "{{ eos_token }}D"
    assert tok.render_chat([]) == "<|endoftext|>D"
    assert isinstance(load_tokenizer(str(src / "qwen2")), HFTokenizer)
    assert load_tokenizer(str(d / "tokenizer.json")).encode(FOX) == tok.encode(FOX)


def test_text_imports_only_downward():
    """text/ sits beside model/ and cache/: no torch, no model/, nothing above it."""
    import ast
    from pathlib import Path

    import prefixcache.text

    banned = ("torch", "prefixcache.model", "prefixcache.engine", "prefixcache.server",
              "prefixcache.bench", "prefixcache.analyze", "prefixcache.cache")
    found = []
    for file in Path(prefixcache.text.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{file.name}: {n}" for n in names
                      if any(n == b or n.startswith(b + ".") for b in banned)]
    assert found == []
    assert len(list(Path(prefixcache.text.__file__).parent.glob("*.py"))) == 13  # + tool_prompt
