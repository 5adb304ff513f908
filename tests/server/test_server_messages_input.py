"""``POST /v1/messages``: a body of the wrong shape gets 400 ``invalid_request_error``
in Anthropic's format, naming the field, and the server keeps serving; streamed usage
(``message_start`` has the prompt's counts, ``message_delta`` the output)."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from prefixcache.server.messages import _events, serve_messages
from tests.server.live import expected_hit, unique_prompt

_USER = [{"role": "user", "content": "hi"}]
_BLOCK = {"type": "text", "text": "hi"}
_TOOL = {"name": "f", "input_schema": {"type": "object"}}


def _msg(**kw) -> dict:
    return {"model": "tiny", "max_tokens": 2, "temperature": 0, "messages": _USER, **kw}


def _user(*blocks) -> list[dict]:
    return [{"role": "user", "content": list(blocks)}]


BAD = [  # (body, the field named in the message)
    (_msg(tools="x"), "tools"),
    (_msg(tools=["x"]), "tools[0]"),
    (_msg(tools=[{"input_schema": {}}]), "tools[0].name"),
    (_msg(tools=[{"name": "f", "input_schema": "x"}]), "tools[0].input_schema"),
    (_msg(tools=[{**_TOOL, "description": 3}]), "tools[0].description"),
    (_msg(tools=[{**_TOOL, "type": "web_search_20250305"}]), "tools[0]"),
    (_msg(tools=[_TOOL], tool_choice="auto"), "tool_choice"),
    (_msg(tools=[_TOOL], tool_choice={"type": "bogus"}), "tool_choice"),
    (_msg(tool_choice={"type": "any"}), "tool_choice"),
    (_msg(tools=[_TOOL], tool_choice={"type": "tool", "name": "nope"}), "tool_choice.name"),
    (_msg(messages="x"), "messages"),
    (_msg(messages=[]), "messages"),
    (_msg(messages=["x"]), "messages[0]"),
    (_msg(messages=[{"role": "system", "content": "x"}]), "messages[0].role"),
    (_msg(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (_msg(messages=_user({"type": "text", "text": 5})), "messages[0].content[0].text"),
    (_msg(messages=_user("x")), "messages[0].content[0]"),
    (_msg(messages=_user({"type": "image"})), "messages[0].content[0]"),
    (_msg(messages=_user({"type": "tool_use", "id": "t", "name": "f", "input": "x"})),
     "messages[0].content[0].input"),
    (_msg(messages=_user({"type": "tool_result", "tool_use_id": 1})),
     "messages[0].content[0].tool_use_id"),
    (_msg(messages=_user({"type": "tool_result", "tool_use_id": "t", "content": [1]})),
     "messages[0].content[0].content[0]"),
    (_msg(system=5), "system"),
    (_msg(system=[{"type": "text", "text": None}]), "system[0].text"),
    (_msg(system=[{**_BLOCK, "cache_control": {"type": "persistent"}}]),
     "system[0].cache_control"),
    (_msg(system=[{**_BLOCK, "cache_control": {"type": "ephemeral", "ttl": "2h"}}]),
     "system[0].cache_control"),
    (_msg(system=[{**_BLOCK, "cache_control": {"type": "ephemeral", "x": 1}}]),
     "system[0].cache_control"),
    (_msg(messages=_user({**_BLOCK, "cache_control": "5m"})),
     "messages[0].content[0].cache_control"),
    (_msg(tools=[{**_TOOL, "cache_control": {}}]), "tools[0].cache_control"),
    (_msg(max_tokens=None), "max_tokens"),
    (_msg(max_tokens=0), "max_tokens"),
    (_msg(max_tokens=True), "max_tokens"),
    (_msg(max_tokens=2.5), "max_tokens"),
    (_msg(temperature=1.5), "temperature"),
    (_msg(temperature="0"), "temperature"),
    (_msg(top_p=0), "top_p"),
    (_msg(top_p=1.1), "top_p"),
    (_msg(top_k=-1), "top_k"),
    (_msg(top_k=1.5), "top_k"),
    (_msg(stop_sequences="END"), "stop_sequences"),
    (_msg(stop_sequences=[1]), "stop_sequences"),
    (_msg(stream="true"), "stream"),
    (_msg(metadata="x"), "metadata"),
    (_msg(metadata={"user_id": 5}), "metadata"),
    (_msg(thinking={"type": "enabled", "budget_tokens": 1024}), "thinking"),
    (_msg(model=""), "model"),
    (_msg(model=5), "model"),
    ({k: v for k, v in _msg().items() if k != "model"}, "model"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_a_bad_body_gets_an_anthropic_400_naming_the_field(server, body, param):
    r = httpx.post(server.base + "/v1/messages", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()
    assert set(err) == {"type", "error"} and err["type"] == "error"
    assert err["error"]["type"] == "invalid_request_error"
    assert err["error"]["message"].startswith(param), err["error"]["message"]


def test_the_server_keeps_serving_after_bad_bodies_and_accepts_the_good_shapes(server):
    for body in (_msg(tools="x"), _msg(messages=_user({"type": "text", "text": 5}))):
        assert httpx.post(server.base + "/v1/messages", json=body, timeout=60).status_code == 400
    good = _msg(system=[{**_BLOCK, "cache_control": {"type": "ephemeral"}}],
                tools=[{**_TOOL, "description": "d"}], tool_choice={"type": "auto"},
                top_p=0.5, top_k=0, stop_sequences=["END"], metadata={"user_id": "u"},
                thinking={"type": "disabled"}, stream=False,
                messages=[{"role": "user", "content": "q"},
                          {"role": "assistant", "content": [
                              {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                          {"role": "user", "content": [
                              {"type": "tool_result", "tool_use_id": "t1", "content": "4"},
                              {**_BLOCK, "cache_control": {"type": "ephemeral",
                                                           "ttl": "1h"}}]}])
    r = httpx.post(server.base + "/v1/messages", json=good, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message" and r.json()["usage"]["output_tokens"] == 2
    r = httpx.post(server.base + "/v1/messages",
                   json=_msg(tools=[_TOOL], tool_choice={"type": "none"}), timeout=60)
    assert r.status_code == 200, r.text


def _stream(server, body: dict) -> tuple[dict, dict]:
    r = httpx.post(server.base + "/v1/messages", json={**body, "stream": True}, timeout=60)
    assert r.status_code == 200
    events = [json.loads(ln[6:]) for ln in r.text.split("\n") if ln.startswith("data: ")]
    assert events[0]["type"] == "message_start" and events[-2]["type"] == "message_delta"
    return events[0]["message"]["usage"], events[-2]["usage"]


def test_message_start_carries_the_prompt_usage_and_message_delta_the_output(server):
    system = [{"type": "text", "text": unique_prompt(),
               "cache_control": {"type": "ephemeral", "ttl": "5m"}}]
    body = _msg(system=system, max_tokens=3)
    start1, delta1 = _stream(server, body)
    start2, delta2 = _stream(server, body)
    chat = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 1, "messages": [
            {"role": "system", "content": system[0]["text"]}, *_USER]}).json()
    total = chat["usage"]["prompt_tokens"]
    hit = expected_hit(total)
    counts = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
              "output_tokens")
    assert tuple(start1[k] for k in counts) == (0, 0, total, 0)
    assert tuple(delta1[k] for k in counts) == (0, 0, total, 3)
    assert tuple(start2[k] for k in counts) == (0, hit, total - hit, 0)
    assert tuple(delta2[k] for k in counts) == (0, hit, total - hit, 3)
    assert start1["cache_creation"] == {"ephemeral_5m_input_tokens": total,
                                        "ephemeral_1h_input_tokens": 0}
    start3, delta3 = _stream(server, _msg(system=unique_prompt(), max_tokens=3))
    assert start3["input_tokens"] == delta3["input_tokens"] > 0
    assert (start3["cache_read_input_tokens"], start3["cache_creation_input_tokens"],
            start3["output_tokens"], delta3["output_tokens"]) == (0, 0, 0, 3)


class _Broken:
    """A serving whose chat fails unexpectedly."""

    async def chat(self, *args, **kw):
        raise RuntimeError("boom")


def test_an_unexpected_error_is_an_anthropic_500():
    resp = asyncio.run(serve_messages(_Broken(), json.dumps(_msg()).encode(), None, None, 0.0))
    assert resp.status_code == 500
    assert json.loads(bytes(resp.body)) == {"type": "error", "error": {
        "type": "api_error", "message": "internal server error: RuntimeError"}}


def test_a_stream_that_breaks_ends_with_an_anthropic_error_event():
    async def chunks():
        yield 'data: {"choices": [], "usage": {"prompt_tokens": 5}}\n\n'
        yield "data: {not json\n\n"

    async def collect():
        return [e async for e in _events(chunks(), "msg_1", "tiny", None)]

    events = asyncio.run(collect())
    assert "event: message_start" in events[0] and '"input_tokens":5' in events[0]
    assert events[-1] == ('event: error\ndata: {"type":"error","error":{"type":"api_error",'
                          '"message":"internal server error: JSONDecodeError"}}\n\n')
