"""The grammar engine over every tokenizer kind, and the EBNF builders.

For the byte tokenizer (builtin model), a transformers tokenizer (Qwen2's vocab.json +
merges.txt) and a bare ``tokenizer.json`` (GPT-2): the tokens of a valid JSON text are
accepted one by one, the bitmask allows exactly what may follow, EOS only once the
value is complete, and accepting EOS terminates the matcher.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.data import shared_data
from prefixcache.model.builtin import tiny_tokenizer
from prefixcache.model.grammar import GrammarEngine, allocate_bitmask, apply_bitmask
from prefixcache.sampling_params import ParamError, StructuredOutputsParams
from prefixcache.text.grammar_ebnf import (
    ebnf_literal,
    json_schema_ebnf,
    tool_call_grammar,
)
from prefixcache.text.hf_tokenizer import HFTokenizer
from prefixcache.text.json_tokenizer import JSONTokenizer

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "n": {"type": "integer"}},
          "required": ["name", "n"], "additionalProperties": False}
TEXT = '{"name": "Zoë 🙂", "n": -42}'


def _tokenizers():
    toks = {"bytes": lambda: (tiny_tokenizer(), 272)}
    toks["hf-qwen2"] = lambda: _hf(shared_data("tokenizers/qwen2"))
    toks["json-gpt2"] = lambda: _json(shared_data("tokenizers/gpt2"))
    return toks


def _hf(path: Path):
    tok = HFTokenizer(path)
    return tok, tok.vocab_size + 7  # a model vocabulary padded past the tokenizer's


def _json(path: Path):
    tok = JSONTokenizer(path, eos_token_ids={50256})
    return tok, tok.vocab_size


def allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[0, token // 32]) >> (token % 32)) & 1)


@pytest.mark.parametrize("kind", list(_tokenizers()))
def test_matcher_follows_a_valid_text_on_every_tokenizer_kind(kind):
    tok, vocab = _tokenizers()[kind]()
    eos = min(tok.eos_token_ids)
    engine = GrammarEngine(tok, vocab, tok.eos_token_ids)
    m = engine.matcher(StructuredOutputsParams(json=SCHEMA))
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.decode(ids) == TEXT
    bitmask = allocate_bitmask(1, vocab)
    assert bitmask.shape == (1, (vocab + 31) // 32) and bitmask.dtype == torch.int32
    m.fill_bitmask(bitmask, 0)
    brace = tok.encode("{", add_special_tokens=False)
    assert len(brace) == 1 and allowed(bitmask, brace[0])
    for bad in ("a", "[", "1"):
        assert not allowed(bitmask, tok.encode(bad, add_special_tokens=False)[0])
    assert not allowed(bitmask, eos)
    assert not any(allowed(bitmask, t) for t in range(tok.vocab_size, vocab))  # padding
    for k in range(1, len(ids) + 1):
        m.advance(ids[:k])
        m.fill_bitmask(bitmask, 0)
        assert allowed(bitmask, eos) == (k == len(ids)), k
    assert m.num_accepted == len(ids) and not m.terminated
    m.advance(ids)  # already seen: nothing happens
    assert m.num_accepted == len(ids)
    m.advance(ids + [eos])
    assert m.terminated


def test_a_token_outside_the_grammar_is_an_error():
    tok = tiny_tokenizer()
    m = GrammarEngine(tok, 272, tok.eos_token_ids).matcher(
        StructuredOutputsParams(choice=["yes", "no"]))
    m.advance(list(b"ye"))
    with pytest.raises(RuntimeError, match="does not continue the grammar"):
        m.advance(list(b"yea"))
    assert m.num_accepted == 2


def test_a_forked_matcher_advances_on_its_own():
    tok = tiny_tokenizer()
    eos = min(tok.eos_token_ids)
    a = GrammarEngine(tok, 272, tok.eos_token_ids).matcher(
        StructuredOutputsParams(choice=["yes", "yak"]))
    a.advance(list(b"y"))
    b = a.fork()
    assert b.num_accepted == 1
    a.advance([*b"yes", eos])
    b.advance(list(b"yak"))  # the fork did not see "es"
    assert a.terminated and not b.terminated and b.num_accepted == 3
    b.advance([*b"yak", eos])
    assert b.terminated


def test_apply_bitmask_sets_disallowed_logits_to_minus_infinity():
    tok = tiny_tokenizer()
    m = GrammarEngine(tok, 272, tok.eos_token_ids).matcher(
        StructuredOutputsParams(regex="[ab]"))
    bitmask = allocate_bitmask(3, 272)
    m.fill_bitmask(bitmask, 1)
    logits = torch.randn(3, 272)
    before = logits.clone()
    apply_bitmask(logits, bitmask, [1])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    finite = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert finite == [ord("a"), ord("b")]
    assert torch.equal(logits[1, finite], before[1, finite])


def test_the_approximate_tokenizer_is_refused():
    from prefixcache.text.approx_tokenizer import ApproxTokenizer

    with pytest.raises(ValueError, match="real tokenizer"):
        GrammarEngine(ApproxTokenizer(), 1000, {0})


# -- the EBNF builders --------------------------------------------------------------------
def _accepts(ebnf: str, text: str) -> bool:
    tok = tiny_tokenizer()
    m = GrammarEngine(tok, 272, tok.eos_token_ids).matcher(
        StructuredOutputsParams(grammar=ebnf))
    try:
        m.advance(list(text.encode()) + [min(tok.eos_token_ids)])
    except RuntimeError:
        return False
    return m.terminated


WEATHER = {"type": "object", "properties": {
    "name": {"const": "get_weather"},
    "arguments": {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}}, "required": ["name", "arguments"]}
ADD = {"type": "object", "properties": {
    "name": {"const": "add"},
    "arguments": {"type": "object", "properties": {"a": {"type": "integer"}},
                  "required": ["a"]}}, "required": ["name", "arguments"]}
W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>'
A = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'


@pytest.mark.parametrize("min_calls,max_calls,text,ok", [
    (1, None, W, True), (1, None, W + "\n" + A + "\n" + W, True), (1, None, "", False),
    (0, None, "", True), (0, 1, A, True), (1, 1, W + "\n" + A, False),
    (2, 3, W, False), (2, 3, W + "\n" + A, True), (2, 3, (W + "\n") * 3 + A, False),
    (1, None, W.replace("get_weather", "nope"), False),
    (1, None, W.replace('"Zürich"', "3"), False),
    (1, None, "text " + W, False),
])
def test_tool_call_grammar(min_calls, max_calls, text, ok):
    ebnf = tool_call_grammar("<tool_call>\n", [WEATHER, ADD], "\n</tool_call>",
                             min_calls, max_calls, any_whitespace=False)
    assert _accepts(ebnf, text) is ok


def test_tool_call_grammar_checks_its_arguments():
    with pytest.raises(ValueError):
        tool_call_grammar("<a>", [], "</a>")
    with pytest.raises(ValueError):
        tool_call_grammar("<a>", [ADD], "</a>", min_calls=3, max_calls=2)
    with pytest.raises(ParamError) as exc:
        tool_call_grammar("<a>", [{"type": "bogus"}], "</a>")
    assert exc.value.param == "tools"


def test_json_schema_ebnf_composes_with_literal_text_and_keeps_non_ascii():
    schema = {"type": "object", "properties": {"é": {"enum": ["ça", "ຜ🙂", "a\\xe9"]}},
              "required": ["é"]}
    rules = json_schema_ebnf(schema, any_whitespace=False)
    ebnf = rules.replace("root ::=", "value ::=", 1)
    ebnf = f"root ::= {ebnf_literal('Answer: ')} value {ebnf_literal(' «end»')}\n{ebnf}"
    for v in ("ça", "ຜ🙂", "a\\xe9"):
        assert _accepts(ebnf, "Answer: " + json.dumps({"é": v}, ensure_ascii=False)
                        + " «end»")
    assert not _accepts(ebnf, 'Answer: {"é": "\u00e7a"}')  # no end marker
    assert not _accepts(ebnf, 'Answer: {"\\u00e9": "ça"} «end»')  # another key
