"""``StructuredOutputsParams`` and ``SamplingParams.structured_outputs``: exactly one kind,
typed fields, canonical keys, and errors naming the field."""
from __future__ import annotations

import pytest

from prefixcache.sampling_params import ParamError, SamplingParams, StructuredOutputsParams


def test_each_kind_and_its_canonical_key():
    a = StructuredOutputsParams(json='{"type": "object", "properties": {"b": {}, "a": {}}}')
    b = StructuredOutputsParams(json={"properties": {"a": {}, "b": {}}, "type": "object"})
    assert a.json == b.json and a == b and hash(a) == hash(b) and a.key() == b.key()
    assert (a.kind, a.param) == ("json", "structured_outputs.json")
    assert a != StructuredOutputsParams(json=b.json, disable_any_whitespace=True)
    assert StructuredOutputsParams(regex="a+").kind == "regex"
    assert StructuredOutputsParams(grammar='root ::= "x"').kind == "grammar"
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    c = StructuredOutputsParams(choice=["x", "y", "x"])
    assert c.choice == ["x", "y"]  # deduplicated, first occurrence kept
    assert StructuredOutputsParams(json=True).json == {}  # JSON Schema's true schema
    assert StructuredOutputsParams(json={}).kind == "json"


def test_sampling_params_takes_an_object_or_a_dict():
    spec = StructuredOutputsParams(regex="[0-9]+")
    assert SamplingParams(structured_outputs=spec).structured_outputs is spec
    p = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert p.structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    assert SamplingParams().structured_outputs is None


@pytest.mark.parametrize("kw,param", [
    ({}, "structured_outputs"),
    ({"json": {}, "regex": "a"}, "structured_outputs"),
    ({"json_object": False}, "structured_outputs"),
    ({"json": "{"}, "structured_outputs.json"),
    ({"json": "[1, 2]"}, "structured_outputs.json"),
    ({"json": 3}, "structured_outputs.json"),
    ({"json": {"x": {1, 2}}}, "structured_outputs.json"),
    ({"regex": ""}, "structured_outputs.regex"),
    ({"regex": 5}, "structured_outputs.regex"),
    ({"grammar": "   "}, "structured_outputs.grammar"),
    ({"choice": []}, "structured_outputs.choice"),
    ({"choice": "ab"}, "structured_outputs.choice"),
    ({"choice": ["a", ""]}, "structured_outputs.choice"),
    ({"json_object": 1}, "structured_outputs.json_object"),
    ({"regex": "a", "disable_any_whitespace": "yes"},
     "structured_outputs.disable_any_whitespace"),
    ({"regex": "a" * ((1 << 20) + 1)}, "structured_outputs.regex"),
])
def test_bad_values_name_the_field(kw, param):
    with pytest.raises(ParamError) as exc:
        StructuredOutputsParams(**kw)
    assert exc.value.param == param


@pytest.mark.parametrize("value,param", [
    ({"jsn": {}}, "structured_outputs.jsn"),
    ("regex", "structured_outputs"),
    ({"regex": ""}, "structured_outputs.regex"),
])
def test_sampling_params_names_the_field_of_a_bad_dict(value, param):
    with pytest.raises(ParamError) as exc:
        SamplingParams(structured_outputs=value)
    assert exc.value.param == param
