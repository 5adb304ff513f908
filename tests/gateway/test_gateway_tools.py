"""Tool calls in answers cross the wire translation both ways, streamed or not, and are
stored only when the tenant's policy lists ``tool_calls``."""
from __future__ import annotations

import json

import pytest

from prefixcache.gateway.policy import TenantPolicy
from tests.gateway.conftest import A, make_gateway, run, sse_data

OA_TOOL = {"type": "function", "function": {"name": "lookup_order", "description": "find",
                                            "parameters": {"type": "object"}}}
AN_TOOL = {"name": "lookup_order", "description": "find", "input_schema": {"type": "object"}}
CALL = {"id": "call_emu_1", "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"q": "emulated"}'}}


@pytest.mark.parametrize("stream", [False, True])
def test_an_anthropic_tool_use_reaches_an_openai_client(emulators, stream):
    emu, url = emulators("anthropic")
    emu.tool_call = True
    gw = make_gateway([("an", url, "anthropic", ("claude-sonnet-4-5",))])
    body = {"model": "claude-sonnet-4-5", "temperature": 0, "max_tokens": 16,
            "messages": [{"role": "user", "content": "where is order 7?"}],
            "tools": [OA_TOOL], "stream": stream}

    r = run(lambda c: c.post("/v1/chat/completions", json=body, headers=A), gw)
    assert emu.bodies[0]["tools"][0]["name"] == "lookup_order"
    if not stream:
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"] == [CALL]
        return
    chunks = [c for c in sse_data(r.text) if c.get("choices")]
    calls = [t for c in chunks for t in c["choices"][0].get("delta", {}).get("tool_calls", [])]
    assert calls == [{"index": 0, **CALL}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_tool_call_reaches_a_messages_client(emulators, stream):
    emu, url = emulators("openai")
    emu.tool_call = True
    gw = make_gateway([("oa", url, "openai", ("gpt-4.1",))])
    body = {"model": "gpt-4.1", "temperature": 0, "max_tokens": 16, "tools": [AN_TOOL],
            "messages": [{"role": "user", "content": "where is order 7?"}], "stream": stream}

    r = run(lambda c: c.post("/v1/messages", json=body, headers=A), gw)
    assert emu.bodies[0]["tools"] == [OA_TOOL]
    use = {"type": "tool_use", "id": "call_emu_1", "name": "lookup_order",
           "input": {"q": "emulated"}}
    if not stream:
        assert r.json()["stop_reason"] == "tool_use"
        assert r.json()["content"][-1] == use
        return
    events = sse_data(r.text)
    start = [e for e in events if e["type"] == "content_block_start" and e["index"] == 1]
    assert start[0]["content_block"] == {**use, "input": {}}
    partial = "".join(e["delta"]["partial_json"] for e in events
                      if e["type"] == "content_block_delta" and e["index"] == 1)
    assert json.loads(partial) == {"q": "emulated"}
    assert [e for e in events if e["type"] == "message_delta"][0]["delta"][
        "stop_reason"] == "tool_use"


def test_tool_call_answers_are_stored_only_when_the_policy_says_so(emulators):
    emu, url = emulators("openai")
    emu.tool_call = True
    body = {"model": "gpt-4.1", "temperature": 0, "tools": [OA_TOOL],
            "messages": [{"role": "user", "content": "order 7?"}]}

    async def go(c):
        out = []
        for _ in range(2):
            r = await c.post("/v1/chat/completions", json=body, headers=A)
            out.append((r.headers["x-prefixcache-cache"],
                        r.json()["choices"][0]["message"].get("tool_calls")))
        return out

    default = run(go, make_gateway([("oa", url, "openai", ("gpt-4.1",))]))
    assert [layer for layer, _ in default] == ["miss", "miss"]
    policy = TenantPolicy(store_finish_reasons=("stop", "length", "tool_calls"))
    stored = run(go, make_gateway([("oa", url, "openai", ("gpt-4.1",))],
                                  policies={"alice": policy}))
    assert stored == [("miss", [CALL]), ("exact", [CALL])]
