"""Structured outputs through the server (``builtin:tiny``, random weights): OpenAI's
``response_format`` through the official client, vLLM's ``structured_outputs`` and
``guided_*`` fields, streaming, and 400s naming the field at fault."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 6},
    "population": {"type": "integer", "minimum": 0, "maximum": 99999},
    "capital": {"type": "boolean"}}, "required": ["city", "population", "capital"],
    "additionalProperties": False}
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0) as c:
        yield c


def _response_format(strict: bool = True) -> dict:
    return {"type": "json_schema",
            "json_schema": {"name": "city", "schema": SCHEMA, "strict": strict}}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chat_json_schema_validates(client, seed):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=seed,
                                       max_tokens=300, response_format=_response_format())
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_chat_json_schema_streams_the_same_text(client):
    kw = dict(model="tiny", messages=MESSAGES, seed=7, max_tokens=300,
              response_format=_response_format())
    whole = client.chat.completions.create(**kw).choices[0].message.content
    parts, reasons = [], []
    for chunk in client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            reasons.append(c.finish_reason)
    assert "".join(parts) == whole
    assert reasons[-1] == "stop"
    jsonschema.validate(json.loads(whole), SCHEMA)


def test_completions_response_format_and_vllm_fields(server):
    bodies = {
        "response_format": {"response_format": _response_format()},
        "structured_outputs": {"structured_outputs": {"json": SCHEMA}},
        "guided_json": {"guided_json": json.dumps(SCHEMA)},
    }
    with httpx.Client(base_url=server.v1, timeout=120) as c:
        for name, extra in bodies.items():
            r = c.post("/completions", json={"model": "tiny", "prompt": "City:", "seed": 5,
                                              "max_tokens": 300, **extra})
            assert r.status_code == 200, (name, r.text[:300])
            choice = r.json()["choices"][0]
            assert choice["finish_reason"] == "stop", (name, choice["text"])
            jsonschema.validate(json.loads(choice["text"]), SCHEMA)


def test_guided_regex_choice_and_grammar(server):
    cases = [
        ({"guided_regex": "[A-Z][a-z]{2,5} [0-9]{2}"}, r"[A-Z][a-z]{2,5} [0-9]{2}"),
        ({"guided_choice": ["north", "south", "east west"]}, r"north|south|east west"),
        ({"guided_grammar": 'root ::= "n=" [0-9]{1,3}'}, r"n=[0-9]{1,3}"),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, r"yes|no"),
    ]
    with httpx.Client(base_url=server.v1, timeout=120) as c:
        for extra, pattern in cases:
            for seed in (1, 2):
                r = c.post("/chat/completions", json={
                    "model": "tiny", "messages": MESSAGES, "seed": seed, "max_tokens": 60,
                    **extra})
                assert r.status_code == 200, r.text[:300]
                msg = r.json()["choices"][0]
                assert msg["finish_reason"] == "stop"
                assert re.fullmatch(pattern, msg["message"]["content"]), (extra, msg)


def test_json_object_is_accepted(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, seed=3,
                                       max_tokens=100, response_format={"type": "json_object"})
    text = r.choices[0].message.content
    assert text.lstrip().startswith("{"), text  # random weights: an object, maybe unfinished
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": "not a schema"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "root ::= undefined_rule"}, "guided_grammar"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn"),
    ({"structured_outputs": {"json": {"type": "no-such-type"}}}, "structured_outputs.json"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "a", "ignore_eos": True}, "ignore_eos"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_structured_outputs_are_400s_naming_the_field(server, extra, param):
    with httpx.Client(base_url=server.v1, timeout=60) as c:
        for path, body in (("/chat/completions", {"messages": MESSAGES}),
                           ("/completions", {"prompt": "x"})):
            r = c.post(path, json={"model": "tiny", "max_tokens": 5, **body, **extra})
            assert r.status_code == 400, (path, r.text[:300])
            err = r.json()["error"]
            assert err["param"] == param, (path, err)
        ok = c.post("/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert ok.status_code == 200  # the server keeps serving
