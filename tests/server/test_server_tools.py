"""Tool calls through real servers and the official clients.

* ``builtin:tiny`` (the session ``server``, random weights): forced calls
  (``tool_choice`` required / named) as ``tool_calls`` and as Messages ``tool_use``
  blocks, streamed and not; 400s naming the field.
* A random-weight Qwen2 with the real Qwen2 tokenizer and a Hermes template
  (:mod:`tests.helpers.hermes_qwen2`): an ``openai`` client tool loop, streamed, whose
  every call hits the previous call's whole pages; and the ``openai-agents`` SDK running
  one task end to end against the server (no network, tracing off).
"""
from __future__ import annotations

import asyncio
import json
import uuid
from typing import Literal

import httpx
import openai
import pytest

from tests.helpers.hermes_qwen2 import write_hermes_qwen2
from tests.server.live import BLOCK, LiveServer


def unique_prompt(text: str) -> str:
    """``text`` after a nonce: no other test shares its pages."""
    return f"[{uuid.uuid4().hex}] {text}"

CITY = {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}}}


def _client(srv: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.v1, api_key="none", max_retries=0, timeout=120)


def _check_call(call, names=("get_weather", "get_time")) -> dict:
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) == 29
    assert call.function.name in names
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city"} and args["city"] in CITY["enum"]
    else:
        assert set(args) == {"zone"} and args["zone"] in ("UTC", "CET")
    return args


def _stream_calls(stream) -> tuple[str, list[dict], str | None]:
    """content, calls (id, name, arguments) and finish_reason of a streamed reply; checks
    the deltas' shape: a call's first delta has id, type and name, later ones arguments."""
    content, calls, finish = "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        content += c.delta.content or ""
        for d in c.delta.tool_calls or []:
            if d.id is not None:
                assert d.index == len(calls) and d.type == "function" and d.function.name
                assert d.function.arguments == ""
                calls.append({"id": d.id, "name": d.function.name, "arguments": ""})
            else:
                assert d.index == len(calls) - 1 and d.function.name is None
                calls[d.index]["arguments"] += d.function.arguments
        finish = c.finish_reason or finish
    return content, calls, finish


def test_required_and_named_choices_give_valid_calls(server):
    c = _client(server)
    msgs = [{"role": "user", "content": unique_prompt("weather in Oslo?")}]
    r = c.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER, TIME],
                                  tool_choice="required", parallel_tool_calls=False,
                                  max_tokens=120, temperature=0)
    (call,) = r.choices[0].message.tool_calls
    _check_call(call)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
    named = {"type": "function", "function": {"name": "get_time"}}
    r = c.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER, TIME],
                                  tool_choice=named, max_tokens=120, temperature=0.8, seed=3)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    _check_call(call)
    stream = c.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER, TIME],
                                       tool_choice=named, max_tokens=120, temperature=0.8,
                                       seed=3, stream=True)
    content, calls, finish = _stream_calls(stream)
    assert content == "" and finish == "tool_calls" and len(calls) == 1
    # the same seed: the streamed call is the same call
    assert (calls[0]["name"], calls[0]["arguments"]) == (call.function.name,
                                                         call.function.arguments)


def test_tool_choice_none_and_auto_without_a_call_answer_with_content(server):
    c = _client(server)
    msgs = [{"role": "user", "content": unique_prompt("hi")}]
    for choice in ("none", "auto"):
        r = c.chat.completions.create(model="tiny", messages=msgs, tools=[WEATHER],
                                      tool_choice=choice, max_tokens=8, temperature=0)
        m = r.choices[0].message
        assert m.tool_calls is None and isinstance(m.content, str) and m.content
        assert r.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("extra,param", [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    ({"functions": [WEATHER["function"]]}, "functions"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}],
      "tool_choice": "required"}, "tools"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(server, extra, param):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], **extra}
    r = httpx.post(server.v1 + "/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_messages_api_tool_use_blocks_streamed_and_not(server):
    tools = [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]
    body = {"model": "tiny", "max_tokens": 120, "temperature": 0, "tools": tools,
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "messages": [{"role": "user", "content": unique_prompt("weather?")}]}
    r = httpx.post(server.v1 + "/messages", json=body, timeout=120)
    assert r.status_code == 200, r.text
    msg = r.json()
    assert msg["stop_reason"] == "tool_use"
    (use,) = [b for b in msg["content"] if b["type"] == "tool_use"]
    assert use["id"].startswith("toolu_") and use["name"] == "get_weather"
    assert use["input"]["city"] in CITY["enum"]
    # the call's result goes back as a tool_result block: the next turn is served
    turn = body["messages"] + [{"role": "assistant", "content": msg["content"]},
                               {"role": "user", "content": [{
                                   "type": "tool_result", "tool_use_id": use["id"],
                                   "content": "sunny"}]}]
    events = []
    with httpx.stream("POST", server.v1 + "/messages", timeout=120,
                      json={**body, "messages": turn, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    starts = [e for e in events if e["type"] == "content_block_start"]
    assert [b["content_block"]["type"] for b in starts] == ["text", "tool_use"]
    block = starts[1]["content_block"]
    assert block["id"].startswith("toolu_") and block["name"] == "get_weather"
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["index"] == 1)
    assert json.loads(partial)["city"] in CITY["enum"]
    stops = [e["index"] for e in events if e["type"] == "content_block_stop"]
    assert stops == [0, 1]
    (delta,) = [e for e in events if e["type"] == "message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and events[-1]["type"] == "message_stop"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = write_hermes_qwen2(tmp_path_factory.mktemp("hermes_qwen2") / "model")
    srv = LiveServer(["--served-model-name", "qwen", "--model", str(folder)],
                     tmp_path_factory.mktemp("qwen_log") / "server.log")
    try:
        srv.wait_ready(300)
        yield srv
    finally:
        srv.stop()


def test_openai_client_tool_loop_streamed_hits_every_previous_page(qwen):
    c = _client(qwen)
    msgs = [{"role": "system", "content": "You answer with tools."},
            {"role": "user", "content": unique_prompt("Weather in Paris, Rome and Oslo?")}]
    previous = None
    for k in range(4):
        stream = c.chat.completions.create(
            model="qwen", messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
            parallel_tool_calls=False, max_tokens=80, temperature=0, stream=True,
            stream_options={"include_usage": True})
        content, calls, finish = "", [], None
        chunks = list(stream)
        usage = chunks[-1].usage
        content, calls, finish = _stream_calls(iter(chunks))
        assert finish == "tool_calls" and len(calls) == 1 and content == ""
        call = calls[0]
        args = json.loads(call["arguments"])
        assert call["name"] in ("get_weather", "get_time") and isinstance(args, dict)
        if previous is not None:  # every whole page of the last prompt and reply hits
            computed = previous.prompt_tokens + previous.completion_tokens - 1
            assert usage.prompt_tokens_details.cached_tokens >= computed // BLOCK * BLOCK
        previous = usage
        msgs.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": call["id"], "type": "function",
            "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": f"result {k}"})


def test_openai_agents_sdk_runs_a_task_against_the_server(qwen):
    agents = pytest.importorskip("agents")
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        RunConfig,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
        """Weather of a city."""
        seen.append(city)
        return f"{city}: sunny, 21 C"

    client = openai.AsyncOpenAI(base_url=qwen.v1, api_key="none", max_retries=0)
    agent = Agent(name="weather", instructions="Use the tools.", tools=[get_weather],
                  model=OpenAIChatCompletionsModel(model="qwen", openai_client=client),
                  model_settings=ModelSettings(tool_choice="get_weather", max_tokens=60,
                                               temperature=0.0),
                  reset_tool_choice=True)
    result = asyncio.run(Runner.run(agent, unique_prompt("Weather in Paris?"), max_turns=3,
                                    run_config=RunConfig(tracing_disabled=True)))
    # the model called the tool (forced), the SDK ran it, then the model answered
    assert len(seen) == 1 and seen[0] in ("Paris", "Rome", "Oslo"), result.new_items
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
    assert isinstance(result.final_output, str)
    assert agents.__name__ == "agents"
