"""Tool-call parsers (Hermes, Llama 3 JSON, Mistral): finished outputs, streams fed in any
pieces, text that is not a call, and the real calls of the glaive tool-call conversations."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixcache.text.tool_parsers.base import ToolCall
from prefixcache.text.tool_parsers.registry import detect_parser, get_parser
from prefixcache.text.tool_parsers.streaming import (
    ArgumentsDelta,
    CallStart,
    ContentDelta,
    StreamingToolParser,
)
from tests.helpers.data import shared_data

HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
          '{"city": "Paris", "days": [1, 2], "note": "a } and a \\" inside"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
HERMES_CALLS = [ToolCall("get_weather", '{"city": "Paris", "days": [1, 2], '
                                        '"note": "a } and a \\" inside"}'),
                ToolCall("get_time", "{}")]
CASES = {
    "hermes": (HERMES, "Let me check.", HERMES_CALLS),
    "llama3_json": ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_time", "parameters": {}}', "",
                    [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}")]),
    "mistral": ('Sure [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_time", "arguments": {}}]', "Sure",
                [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}")]),
    "mistral_args": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}get_time[ARGS]{}', "",
                     [ToolCall("get_weather", '{"city": "Paris"}'), ToolCall("get_time", "{}")]),
}


def _parser(case: str):
    return get_parser(case.split("_args")[0])


def stream(case_parser, pieces: list[str]) -> tuple[str, list[ToolCall], list]:
    """Content and calls rebuilt from the events of ``pieces`` fed one by one."""
    sp = StreamingToolParser(case_parser)
    events = []
    for p in pieces:
        events += sp.feed(p)
    events += sp.finish()
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls: dict[int, list[str]] = {}
    for e in events:
        if isinstance(e, CallStart):
            assert e.index == len(calls) and e.id.startswith("call_") and len(e.id) == 29
            calls[e.index] = [e.name, ""]
        elif isinstance(e, ArgumentsDelta):
            calls[e.index][1] += e.text
    return content, [ToolCall(n, a) for n, a in calls.values()], events


@pytest.mark.parametrize("case", sorted(CASES))
def test_finished_output_and_character_stream_agree(case):
    text, content, calls = CASES[case]
    parser = _parser(case)
    assert parser.extract(text) == (content, calls)
    got_content, got_calls, events = stream(parser, list(text))
    assert got_calls == calls
    assert got_content.strip() == content
    # the name comes first, in its own event, before any argument fragment of that call
    first = {e.index: e for e in reversed(events) if isinstance(e, (CallStart, ArgumentsDelta))}
    assert all(isinstance(e, CallStart) for e in first.values())


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(sorted(CASES)), cuts=st.lists(st.integers(0, 200), max_size=12))
def test_any_split_of_the_stream_gives_the_same_calls(case, cuts):
    text, content, calls = CASES[case]
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    got_content, got_calls, events = stream(_parser(case), pieces)
    assert got_calls == calls and got_content.strip() == content
    for e in events:  # no marker ever leaks into content, whole or partial
        if isinstance(e, ContentDelta):
            assert "<tool" not in e.text and "[TOOL" not in e.text and "{" not in e.text


@pytest.mark.parametrize("text", [
    "<tool_call>\n{\"name\": 1, \"arguments\": {}}\n</tool_call> after",   # name not a string
    "<tool_call>\nnot json\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",    # arguments a list
    "before <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": ",       # cut
    "a < b and <tool_ is not a tag",
])
def test_text_that_is_not_a_valid_call_stays_content(text):
    assert get_parser("hermes").extract(text) == (text, [])
    content, calls, _ = stream(get_parser("hermes"), list(text))
    if text.startswith("before"):  # the stream sent the call's start before the cut
        assert calls == [ToolCall("f", '{"a":')] and content == "before"
    else:
        assert calls == [] and content == text


def test_llama3_and_mistral_invalid_outputs_stay_content():
    assert get_parser("llama3_json").extract("Paris is sunny.") == ("Paris is sunny.", [])
    bad = '{"name": "f", "parameters": {}} trailing'
    assert get_parser("llama3_json").extract(bad) == (bad, [])
    bad = '[TOOL_CALLS][{"name": "f"'
    assert get_parser("mistral").extract(bad) == (bad, [])


def test_arguments_written_as_a_json_string_are_read_as_an_object():
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"x\\": 1}"}\n</tool_call>'
    assert get_parser("hermes").extract(text) == ("", [ToolCall("f", '{"x": 1}')])


def test_the_template_syntax_picks_the_parser():
    assert detect_parser("... <tool_call>\n{{ call | tojson }} ...") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("<|python_tag|>{{ x }}") == "llama3_json"
    assert detect_parser("<|im_start|>{{ message['role'] }}") is None
    with pytest.raises(ValueError, match="known: hermes, llama3_json, mistral"):
        get_parser("pythonic")


def test_glaive_calls_parse_back_exactly():
    """Every function call of the glaive tool-call conversations, written as Hermes,
    Llama 3 JSON and Mistral calls, parses back to the same name and arguments."""
    data = json.loads((shared_data("glaive_toolcall") / "glaive_toolcall_en_demo.json")
                      .read_text())
    calls = [json.loads(turn["value"]) for conv in data for turn in conv["conversations"]
             if turn["from"] == "function_call"]
    assert len(calls) > 100
    for call in calls:
        args = json.dumps(call["arguments"], ensure_ascii=False)
        forms = {
            "hermes": f'<tool_call>\n{{"name": "{call["name"]}", "arguments": {args}}}\n'
                      "</tool_call>",
            "llama3_json": f'{{"name": "{call["name"]}", "parameters": {args}}}',
            "mistral": f'[TOOL_CALLS][{{"name": "{call["name"]}", "arguments": {args}}}]',
        }
        for name, text in forms.items():
            content, got = get_parser(name).extract(text)
            assert content == "" and len(got) == 1, (name, text)
            assert got[0].name == call["name"]
            assert json.loads(got[0].arguments) == call["arguments"]
