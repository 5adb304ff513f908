"""Structured outputs through the engine on ``builtin:tiny`` (random weights: the token
mask alone must make every output valid).

Every JSON output parses and validates with ``jsonschema``, over hand-written schemas and
hypothesis-generated ones (bounded, so that a random model finishes them); regex, choice
and EBNF grammars (literal text mixed with JSON, as tool calls) match; greedy, seeded,
penalties and logprobs; preemption and abort; the compiled-grammar cache.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from prefixcache.sampling_params import ParamError, StructuredOutputsParams
from prefixcache.text.grammar_ebnf import tool_call_grammar

MAX_TOKENS = 600
PROMPTS = ["Hello", "Write JSON:", "<|user|>tell me<|assistant|>", "x" * 40]


@pytest.fixture(scope="module")
def llm():
    with LLM("builtin:tiny", block_size=16, num_pages=512, max_num_seqs=64) as llm:
        yield llm


def no_leak(llm):
    s = llm.stats()
    check_invariants(llm.engine.cache)
    assert s["pages_live"] == 0
    assert s["pages_free"] + s["pages_cached"] == s["pages_total"]


def so(**kw) -> StructuredOutputsParams:
    return StructuredOutputsParams(**kw)


def params(spec: StructuredOutputsParams, i: int = 0, **kw) -> SamplingParams:
    kw.setdefault("temperature", 1.0)
    kw.setdefault("seed", 1000 + i)
    kw.setdefault("max_tokens", MAX_TOKENS)
    return SamplingParams(structured_outputs=spec, **kw)


def check_json(out, schema: dict) -> object:
    c = out.outputs[0]
    assert c.finish_reason == "stop", (c.finish_reason, c.text)
    value = json.loads(c.text)  # strict: control characters in strings fail
    jsonschema.validate(value, schema)
    return value


SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "admin": {"type": "boolean"}}, "required": ["name", "age", "admin"]},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
     "maxItems": 4},
    {"type": "object", "properties": {
        "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                 "maxItems": 3},
        "score": {"type": "integer", "minimum": -5, "maximum": 5},
        "note": {"anyOf": [{"type": "null"}, {"const": "ok"}]}},
     "required": ["id", "tags", "score", "note"], "additionalProperties": False},
    {"type": "object", "properties": {
        "point": {"type": "object", "properties": {
            "x": {"type": "integer", "minimum": 0, "maximum": 9},
            "y": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["x", "y"]},
        "label": {"enum": ["a", "b", 3, True, None]}},
     "required": ["point", "label"]},
    {"type": "string", "enum": ["yes", "no"]},
    {"type": "integer", "minimum": 100, "maximum": 999},
    {"$defs": {"leaf": {"type": "object", "properties": {"v": {"type": "boolean"}},
                        "required": ["v"]}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref":
                                                "#/$defs/leaf"}, "maxItems": 2}},
     "required": ["items"]},
]


@pytest.mark.parametrize("whitespace", [False, True], ids=["compact", "any-whitespace"])
def test_every_output_validates_against_its_schema(llm, whitespace):
    specs = [so(json=s, disable_any_whitespace=not whitespace) for s in SCHEMAS]
    cases = [(s, spec, p) for s, spec in zip(SCHEMAS, specs) for p in PROMPTS]
    outs = llm.generate([p for _, _, p in cases],
                        [params(spec, i) for i, (_, spec, _) in enumerate(cases)])
    for (schema, _, _), out in zip(cases, outs):
        check_json(out, schema)
    no_leak(llm)


def test_greedy_output_validates_and_ends_with_the_stop_token(llm):
    outs = llm.generate(PROMPTS, params(so(json=SCHEMAS[0], disable_any_whitespace=True),
                                        temperature=0.0, seed=None))
    for out in outs:
        check_json(out, SCHEMAS[0])
        # the stop token ends the output and is kept in token_ids, as EOS always is
        assert out.outputs[0].token_ids[-1] in llm.engine.outputs.eos_token_ids


def test_json_object_starts_an_object_and_never_a_bare_value(llm):
    # a random model may write an unbounded string forever: only the start is certain
    outs = llm.generate(PROMPTS, [params(so(json_object=True), i, max_tokens=200)
                                  for i in range(4)])
    for out in outs:
        c = out.outputs[0]
        assert c.text.lstrip(" \n\t\r").startswith("{"), c.text
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict)


# -- hypothesis-generated schemas (bounded: a random model must be able to finish them) --
_NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
_LEAVES = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-1000, 1000), st.integers(0, 5000)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
              st.integers(0, 3), st.integers(0, 5)),
    st.builds(lambda vals: {"enum": vals},
              st.lists(st.one_of(st.integers(-50, 50), st.text("ab c\"\\é", max_size=4),
                                 st.booleans(), st.none()),
                       min_size=1, max_size=4, unique_by=lambda v: (type(v), v))),
    st.sampled_from([{"type": "string", "pattern": "^[a-z]{1,4}$"},
                     {"type": "string", "pattern": "^[0-9]{3}-[0-9]{2}$"},
                     {"const": "fixed"}, {"type": "string", "format": "date"}]),
)


def _object(props: dict, data) -> dict:
    names = list(props)
    required = [n for n in names if data.draw(st.booleans())]
    return {"type": "object", "properties": props, "required": required,
            "additionalProperties": False}


@st.composite
def _schemas(draw):
    def extend(children):
        return st.one_of(
            st.builds(lambda item, lo, span: {"type": "array", "items": item,
                                              "minItems": lo, "maxItems": lo + span},
                      children, st.integers(0, 2), st.integers(0, 2)),
            st.builds(lambda props: props, st.dictionaries(_NAMES, children, min_size=1,
                                                           max_size=4)).map(
                lambda props: {"type": "object", "properties": props,
                               "required": sorted(props)[: len(props) // 2 + 1],
                               "additionalProperties": False}),
            st.builds(lambda a, b: {"anyOf": [a, b]}, children, children),
        )
    return draw(st.recursive(_LEAVES, extend, max_leaves=8))


@settings(max_examples=6, deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is a batch
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(schemas=st.lists(_schemas(), min_size=8, max_size=8), greedy=st.booleans())
def test_hypothesis_schemas_always_validate(llm, schemas, greedy):
    kw = {"temperature": 0.0, "seed": None} if greedy else {}
    outs = llm.generate(PROMPTS[:2] * 4, [
        params(so(json=s, disable_any_whitespace=True), i, **kw)
        for i, s in enumerate(schemas)])
    for schema, out in zip(schemas, outs):
        check_json(out, schema)


# -- other kinds ------------------------------------------------------------------------
def test_regex_choice_and_grammar(llm):
    specs = {
        "regex": so(regex=r"[0-9]{3}-[a-z]{2,4}( ok)?"),
        "choice": so(choice=["alpha", "beta", "gamma delta"]),
        "grammar": so(grammar='root ::= "x=" num ("," num){0,3}\nnum ::= [1-9][0-9]{0,2}'),
    }
    checks = {
        "regex": lambda t: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}( ok)?", t),
        "choice": lambda t: t in ("alpha", "beta", "gamma delta"),
        "grammar": lambda t: re.fullmatch(r"x=[1-9][0-9]{0,2}(,[1-9][0-9]{0,2}){0,3}", t),
    }
    for kind, spec in specs.items():
        outs = llm.generate(PROMPTS * 3, [params(spec, i) for i in range(len(PROMPTS) * 3)])
        for out in outs:
            c = out.outputs[0]
            assert c.finish_reason == "stop" and checks[kind](c.text), (kind, c.text)


def test_tool_call_grammar_mixes_literal_text_and_json(llm):
    tools = [
        {"type": "object", "properties": {
            "name": {"const": "get_weather"},
            "arguments": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8}}, "required": ["city"]}},
         "required": ["name", "arguments"]},
        {"type": "object", "properties": {
            "name": {"const": "add"},
            "arguments": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99}},
                "required": ["a", "b"]}},
         "required": ["name", "arguments"]},
    ]
    grammar = tool_call_grammar("<tool_call>\n", tools, "\n</tool_call>", min_calls=1,
                                max_calls=3)
    outs = llm.generate(PROMPTS * 2, [params(so(grammar=grammar), i) for i in range(8)])
    calls = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)
    for out in outs:
        text = out.outputs[0].text
        assert out.outputs[0].finish_reason == "stop", text
        found = calls.findall(text)
        assert 1 <= len(found) <= 3
        assert calls.sub("", text).strip("\n") == ""  # nothing but calls and separators
        for body in found:
            call = json.loads(body)
            jsonschema.validate(call, {"anyOf": tools})


# -- sampling options -------------------------------------------------------------------
def test_seeded_sampling_is_reproducible_and_greedy_is_deterministic(llm):
    spec = so(json=SCHEMAS[0], disable_any_whitespace=True)
    a = llm.generate(PROMPTS, [params(spec, i) for i in range(4)])
    b = llm.generate(PROMPTS[::-1], [params(spec, i) for i in range(4)][::-1])[::-1]
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert len({o.outputs[0].text for o in a}) > 1  # the seeds differ
    g = [llm.generate(PROMPTS[1], params(spec, temperature=0.0, seed=None))[0]
         for _ in range(2)]
    assert g[0].outputs[0].token_ids == g[1].outputs[0].token_ids


def test_penalties_top_k_and_logprobs(llm):
    spec = so(json=SCHEMAS[2], disable_any_whitespace=True)
    outs = llm.generate(PROMPTS, [params(spec, i, presence_penalty=1.5,
                                         frequency_penalty=0.5, repetition_penalty=1.3,
                                         top_k=20, top_p=0.9, logprobs=3)
                                  for i in range(4)])
    for out in outs:
        check_json(out, SCHEMAS[2])
        c = out.outputs[0]
        assert len(c.logprobs) == len(c.token_ids)
        for tok, lp in zip(c.token_ids, c.logprobs):
            assert tok in lp and lp[tok].logprob <= 0.0  # of the raw distribution


def test_a_preempted_request_recomputes_without_advancing_its_grammar_twice():
    spec = so(regex="[a-z]{70}")  # 70 tokens (one byte each), then EOS
    prompts = [{"prompt_token_ids": [256] + [97 + (i + k) % 26 for i in range(149)]}
               for k in range(2)]
    p = params(spec, temperature=0.0, seed=None, max_tokens=100)
    with LLM("builtin:tiny", block_size=16, num_pages=256) as big:
        ref = big.generate(prompts, p)
    # 20 pages: both 150-token prompts fit, both cannot grow to 221 tokens
    with LLM("builtin:tiny", block_size=16, num_pages=20) as small:
        outs = small.generate(prompts, p)
        assert small.stats()["num_preemptions"] >= 1
        no_leak(small)
    for o, r in zip(outs, ref):
        assert o.outputs[0].token_ids == r.outputs[0].token_ids
        assert re.fullmatch("[a-z]{70}", o.outputs[0].text)
        assert o.outputs[0].finish_reason == "stop"


def test_abort_mid_grammar_frees_everything(llm):
    eng = llm.engine
    eng.add_request("so-abort", [256, 72, 105], params(so(json=SCHEMAS[0])))
    while not eng.requests["so-abort"].output_token_ids:
        eng.step()
    assert eng.requests["so-abort"].grammar.num_accepted >= 1
    assert eng.abort_request("so-abort")
    while eng.has_unfinished_requests():
        eng.step()
    no_leak(llm)


# -- the compiled-grammar cache and bad input ---------------------------------------------
def test_compiled_grammar_cache_counts_hits_and_misses():
    with LLM("builtin:tiny", block_size=16, num_pages=64) as llm:
        schema = {"type": "object", "properties": {"k": {"type": "boolean"}},
                  "required": ["k"]}
        same = json.dumps({"required": ["k"], "properties": {"k": {"type": "boolean"}},
                           "type": "object"})  # equal, keys in another order, as text
        llm.generate("a", params(so(json=schema)))
        s = llm.stats()
        assert (s["grammar_cache_misses"], s["grammar_cache_size"]) == (1, 1)
        hits = s["grammar_cache_hits"]
        llm.generate(["b", "c"], params(so(json=same)))
        s = llm.stats()
        assert s["grammar_cache_misses"] == 1 and s["grammar_cache_hits"] > hits
        assert s["grammar_compile_s"] > 0.0
        llm.generate("d", params(so(json=schema, disable_any_whitespace=True)))
        assert llm.stats()["grammar_cache_misses"] == 2  # another grammar


def test_the_cache_is_bounded():
    with LLM("builtin:tiny", block_size=16, num_pages=64) as llm:
        eng = llm.engine.grammar
        eng.cache_size = 3
        for k in range(5):
            eng.compile(so(regex=f"a{{{k + 1}}}"))
        assert eng.stats["grammar_cache_size"] == 3
        eng.compile(so(regex="a{5}"))  # the most recent one stayed
        assert eng.stats["grammar_cache_hits"] == 1
        eng.compile(so(regex="a{1}"))  # the oldest one went
        assert eng.stats["grammar_cache_misses"] == 6


@pytest.mark.parametrize("spec,param", [
    (dict(json={"type": "no-such-type"}), "structured_outputs.json"),
    (dict(regex="(unclosed"), "structured_outputs.regex"),
    (dict(grammar="root ::= missing_rule"), "structured_outputs.grammar"),
])
def test_uncompilable_specs_are_refused_naming_the_field(llm, spec, param):
    before = dict(llm.engine.requests)
    with pytest.raises(ParamError) as exc:
        llm.generate("a", params(so(**spec)))
    assert exc.value.param == param
    assert llm.engine.requests == before
    no_leak(llm)


@pytest.mark.parametrize("kw,param", [
    (dict(ignore_eos=True), "ignore_eos"), (dict(min_tokens=2), "min_tokens")])
def test_options_a_grammar_cannot_honour_are_refused(llm, kw, param):
    with pytest.raises(ParamError) as exc:
        llm.generate("a", params(so(json_object=True), **kw))
    assert exc.value.param == param
