"""Tools on the server without a server: tools/tool_choice checks and plans, the forced
grammar, reply messages and stream deltas, and the transcript token records."""
from __future__ import annotations

import json

import pytest

from prefixcache.http.errors import APIError
from prefixcache.server.responses import chat_message, tool_deltas
from prefixcache.server.tools import choose_parser, forced_grammar, plan_tools
from prefixcache.server.transcripts import TranscriptTokens
from prefixcache.text.tool_parsers.registry import get_parser
from prefixcache.text.tool_parsers.streaming import StreamingToolParser

F = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}
G = {"type": "function", "function": {"name": "g"}}


@pytest.mark.parametrize("tools,choice,param", [
    ([F], "sometimes", "tool_choice"),
    ([F], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    ([F], {"type": "function"}, "tool_choice"),
    (None, "required", "tool_choice"),
    ([{"type": "retrieval"}], "auto", "tools[0]"),
    ([{"type": "function"}], "auto", "tools[0].function"),
    ([{"type": "function", "function": {"name": ""}}], "auto", "tools[0].function.name"),
    ([F, F], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "h", "parameters": []}}], "auto",
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "h", "parameters": {"type": "string"}}}],
     "required", "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": 'bad name!<>"'}}], "auto",
     "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "auto", "tools[0].function.name"),
])
def test_bad_tools_and_tool_choice_are_400_naming_the_field(tools, choice, param):
    with pytest.raises(APIError) as exc:
        plan_tools(tools, choice, None, "hermes")
    assert exc.value.status == 400 and exc.value.param == param


def test_plans():
    assert plan_tools(None, None, None, "hermes") is None
    assert plan_tools([F], "none", None, "hermes") is None
    auto = plan_tools([F, G], None, None, "hermes")
    assert auto is not None and auto.choice == "auto" and not auto.forced
    assert [t["name"] for t in auto.tools] == ["f", "g"]
    assert auto.tools[1]["parameters"] == {"type": "object", "properties": {}}
    named = plan_tools([F, G], {"type": "function", "function": {"name": "g"}}, None, "hermes")
    assert named is not None and named.choice == "g" and named.forced
    assert choose_parser(None, "x <tool_call> y") == "hermes"
    assert choose_parser(None, "[TOOL_CALLS]") == "mistral"
    assert choose_parser(None, None) == "hermes"
    with pytest.raises(ValueError):
        choose_parser("nope", None)


def test_forced_grammar_by_syntax():
    g = forced_grammar(plan_tools([F, G], "required", False, "hermes"))
    assert '"<tool_call>\\n"' in g and '"\\n</tool_call>"' in g
    llama = forced_grammar(plan_tools([F], "required", None, "llama3_json"))
    assert "parameters" in llama
    with pytest.raises(APIError) as exc:
        forced_grammar(plan_tools([F], "required", None, "mistral"))
    assert exc.value.param == "tool_choice"


@pytest.mark.parametrize("parallel,calls_allowed", [(None, 1), (False, 1), (True, 2)])
def test_required_allows_one_call_unless_parallel_calls_are_asked(parallel, calls_allowed):
    """A model that never ends its turn after a call must not repeat it to max_tokens:
    ``required`` allows a second call only with ``parallel_tool_calls: true``."""
    from xgrammar import Grammar
    from xgrammar.testing import _is_grammar_accept_string as accepts

    grammar = Grammar.from_ebnf(forced_grammar(plan_tools([F], "required", parallel,
                                                          "hermes")))
    call = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    assert accepts(grammar, call)
    assert accepts(grammar, call + "\n" + call) == (calls_allowed == 2)


def test_reply_message_and_stream_deltas():
    plan = plan_tools([F], "auto", None, "hermes")
    text = 'ok<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
    msg, finish = chat_message(plan, text, "stop")
    assert finish == "tool_calls" and msg["content"] == "ok"
    (call,) = msg["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert chat_message(plan, "just text", "stop") == (
        {"role": "assistant", "content": "just text"}, "stop")
    assert chat_message(None, text, "stop")[0] == {"role": "assistant", "content": text}
    two = text + '<tool_call>\n{"name": "f", "arguments": {"x": 2}}\n</tool_call>'
    assert len(chat_message(plan, two, "stop")[0]["tool_calls"]) == 2
    single = plan_tools([F], "auto", False, "hermes")
    (only,) = chat_message(single, two, "stop")[0]["tool_calls"]
    assert only["function"]["arguments"] == '{"x": 1}'
    sent = tool_deltas(StreamingToolParser(get_parser("hermes")), two, True, parallel=False)
    assert {d["tool_calls"][0]["index"] for d in sent if "tool_calls" in d} == {0}
    sp = StreamingToolParser(get_parser("hermes"))
    deltas = tool_deltas(sp, text[:30], False) + tool_deltas(sp, text[30:], True)
    assert deltas[0] == {"content": "ok"}
    start = deltas[1]["tool_calls"][0]
    assert start["index"] == 0 and start["id"].startswith("call_")
    assert start["function"] == {"name": "f", "arguments": ""}
    args = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[2:])
    assert json.loads(args) == {"x": 1} and args == '{"x": 1}'


def test_transcripts_reuse_ids_per_namespace_within_bounds():
    t = TranscriptTokens(max_tokens=10, max_per_namespace=2)
    enc = [ord(c) for c in "abcdef"]
    t.record(("alice", None), "abc", [7, 8])      # the model's own tokens for "abc"
    assert t.encode(("alice", None), "abcdef", lambda s: [ord(c) for c in s]) == \
        [7, 8, ord("d"), ord("e"), ord("f")]
    # another tenant's record never shapes this one's tokens
    assert t.encode(("bob", None), "abcdef", lambda s: [ord(c) for c in s]) == enc
    t.record(("alice", None), "abcd", [1, 2, 3])  # the longest match wins
    assert t.encode(("alice", None), "abcdef", lambda s: [0] * len(s)) == [1, 2, 3, 0, 0]
    t.record(("alice", None), "x", [5])           # third record: the oldest one goes
    assert len(t) == 2 and t.encode(("alice", None), "abcZ", lambda s: [0] * len(s)) == \
        [0, 0, 0, 0]
    t.record(("bob", None), "y" * 5, [1] * 9)     # over the token bound: LRU evicted
    assert sum(1 for _ in range(len(t))) <= 2 and t._tokens <= 10


def test_messages_events_from_chat_chunks_with_calls():
    """Chat chunks (text, a call in pieces, text again) -> Messages blocks in order."""
    import asyncio

    from prefixcache.server.messages import _events

    usage = {"prompt_tokens": 5, "completion_tokens": 3,
             "prompt_tokens_details": {"cached_tokens": 0}}
    deltas = [{"content": "Checking."},
              {"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                               "function": {"name": "f", "arguments": ""}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
              {"content": "Done."}]
    finals = [{"delta": d, "finish_reason": None} for d in deltas]
    finals.append({"delta": {}, "finish_reason": "tool_calls"})
    chunks = ["data: " + json.dumps({"choices": [c], "usage": usage}) + "\n\n"
              for c in finals] + ["data: [DONE]\n\n"]

    async def source():
        for c in chunks:
            yield c

    async def collect():
        return [e async for e in _events(source(), "msg_1", "m", None)]

    text = "".join(asyncio.run(collect()))
    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
    starts = [(e["index"], e["content_block"]["type"]) for e in events
              if e["type"] == "content_block_start"]
    assert starts == [(0, "text"), (1, "tool_use"), (2, "text")]
    tool = next(e for e in events if e["type"] == "content_block_start" and e["index"] == 1)
    assert tool["content_block"]["id"] == "toolu_abc"
    parts = [e["delta"].get("partial_json") or e["delta"].get("text") for e in events
             if e["type"] == "content_block_delta"]
    assert parts == ["Checking.", '{"x": ', "1}", "Done."]
    assert [e["index"] for e in events if e["type"] == "content_block_stop"] == [0, 1, 2]
    assert events[-2]["delta"]["stop_reason"] == "tool_use"
