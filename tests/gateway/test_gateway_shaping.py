"""Layer 3: breakpoints reach the emulated Anthropic upstream, cache reads rise from turn
2; OpenAI prompt_cache_key; TTL from reuse; volatile prefixes and rewritten history."""
from __future__ import annotations

import asyncio

import httpx

from prefixcache.gateway.history import HistoryWatch, volatile_span
from prefixcache.gateway.shaping import (
    ReuseClock,
    estimate_tokens,
    min_cacheable_tokens,
    place_breakpoints,
    prompt_cache_key,
)
from tests.gateway.conftest import A, B, chat, make_gateway, run

CLAUDE = "claude-sonnet-4-5"
SYSTEM = "You are a careful support agent for the ACME store. " * 100  # ~1300 tokens
TOOL = {"type": "function", "function": {"name": "lookup_order", "description": "find",
                                         "parameters": {"type": "object"}}}


def _marks(body: dict) -> list[str]:
    out = ["tools" for t in body.get("tools") or [] if t.get("cache_control")]
    out += ["system" for b in body.get("system") or [] if b.get("cache_control")]
    for i, m in enumerate(body["messages"]):
        out += [f"m{i}" for b in m["content"] if b.get("cache_control")]
    return out


def _conversation(client, path: str, turns: int, headers=A):
    async def go(c):
        usages, msgs = [], []
        for t in range(turns):
            msgs.append({"role": "user", "content": f"question {t}: where is my order?"})
            if path == "/v1/messages":
                body = {"model": CLAUDE, "max_tokens": 16, "temperature": 0,
                        "system": SYSTEM, "messages": msgs}
            else:
                body = {"model": CLAUDE, "max_tokens": 16, "temperature": 0,
                        "messages": [{"role": "system", "content": SYSTEM}, *msgs],
                        "tools": [TOOL]}
            r = await c.post(path, json=body, headers=headers)
            assert r.status_code == 200, r.text
            d = r.json()
            usages.append(d["usage"])
            answer = (d["content"][0]["text"] if path == "/v1/messages"
                      else d["choices"][0]["message"]["content"])
            msgs.append({"role": "assistant", "content": answer})
        return usages

    return go


def test_breakpoints_reach_anthropic_and_cache_reads_rise_from_turn_2(emulators):
    emu, url = emulators("anthropic")
    gw = make_gateway([("an", url, "anthropic", (CLAUDE,))])
    usages = run(_conversation(None, "/v1/chat/completions", 3), gw)
    first = emu.bodies[0]
    assert _marks(first) == ["system", "m0"]  # the tool alone is under the minimum
    assert _marks(emu.bodies[2]) == ["system", "m4"]
    assert first["system"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    reads = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert reads[0] == 0 and 0 < reads[1] < reads[2]
    raw = emu.usages
    assert raw[0]["cache_creation_input_tokens"] > estimate_tokens(SYSTEM)
    assert raw[1]["cache_read_input_tokens"] == raw[0]["cache_creation_input_tokens"]


def test_messages_style_input_gets_the_same_breakpoints(emulators):
    emu, url = emulators("anthropic")
    gw = make_gateway([("an", url, "anthropic", (CLAUDE,))])
    usages = run(_conversation(None, "/v1/messages", 3), gw)
    assert _marks(emu.bodies[1]) == ["system", "m2"]
    reads = [u["cache_read_input_tokens"] for u in usages]
    assert reads[0] == 0 and 0 < reads[1] < reads[2]
    assert usages[0]["cache_creation_input_tokens"] > 0
    assert usages[1]["input_tokens"] < usages[0]["input_tokens"] + 50


def test_a_short_prompt_gets_no_breakpoint():
    msg = {"system": "short", "messages": [{"role": "user", "content": "hi"}]}
    assert place_breakpoints(msg, "5m", 1024) == []
    assert "cache_control" not in msg["system"][0]
    assert min_cacheable_tokens("claude-sonnet-4-5") == 1024
    assert min_cacheable_tokens("claude-sonnet-4-5-20250929") == 1024


def test_long_agent_turns_add_a_lookback_breakpoint_and_never_more_than_4():
    tools = [{"name": f"t{i}", "input_schema": {"x": "y" * 2000}} for i in range(3)]
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"step {i} " * 50}
            for i in range(30)]
    msg = {"system": SYSTEM, "tools": tools, "messages": msgs}
    placed = place_breakpoints(msg, "1h", 1024)
    assert placed == ["tools", "system", "lookback", "turn"]
    assert "cache_control" in msgs[9]["content"][0]
    assert msgs[29]["content"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}


def test_ttl_follows_the_expected_reuse():
    now = [0.0]
    clock = ReuseClock(clock=lambda: now[0])
    body = chat(CLAUDE, "q", system="S")
    assert clock.ttl("a", body) == "5m"       # first sight
    now[0] = 200
    assert clock.ttl("a", body) == "5m"       # reused within 5 minutes
    now[0] = 800
    assert clock.ttl("a", body) == "1h"       # a 5-minute entry would have expired
    assert clock.ttl("b", body) == "5m"       # another tenant's prefix is its own


def test_openai_upstreams_get_a_prompt_cache_key_per_tenant_and_prefix(emulators):
    emu, url = emulators("openai")
    gw = make_gateway([("oa", url, "openai", ("gpt-4.1",))])

    async def go(c):
        for h, s, q in ((A, "S1", "q1"), (A, "S1", "q2"), (A, "S2", "q1"), (B, "S1", "q1")):
            await c.post("/v1/chat/completions", json=chat("gpt-4.1", q, system=s), headers=h)

    run(go, gw)
    keys = [b["prompt_cache_key"] for b in emu.bodies]
    assert keys[0] == keys[1] == prompt_cache_key("alice", chat("gpt-4.1", "x", system="S1"))
    assert len(set(keys)) == 3


def test_volatile_text_near_the_start_is_found():
    rest = "You are a helpful assistant. Follow the policy below carefully. " * 5
    a = f"Current time: 2026-12-01 10:41:07. {rest} Q1"
    b = f"Current time: 2026-12-01 10:52:33. {rest} Q1"
    span = volatile_span(a, b)
    assert span is not None and "52:33" in span
    assert volatile_span(f"{rest} Q1", f"{rest} Q2") is None  # diverges at the end


def test_volatile_prefixes_are_counted_per_tenant(emulators):
    emu, url = emulators("openai")
    gw = make_gateway([("oa", url, "openai", ("gpt-4.1",))])
    rest = "Policy: answer briefly and cite the order number when you have it. " * 4

    async def go(c):
        for ts in ("10:41:07", "10:52:33", "11:03:10"):
            await c.post("/v1/chat/completions",
                         json=chat("gpt-4.1", "hi", system=f"Now: {ts}. {rest}"), headers=A)

    run(go, gw)
    assert gw.metrics.tenants["alice"].volatile_prefixes == 2
    assert b'prefixcache_gateway_prefix_breakers_total{kind="volatile_prefix",tenant="alice"} ' \
           b'2.0' in gw.metrics.render()


def test_rewritten_history_counts_the_tokens_to_recompute():
    w = HistoryWatch()
    turn1 = chat("m", "first question", system="S")
    assert w.observe("a", turn1).rewritten_tokens == 0
    w.answered("a", turn1, "<think>long reasoning</think> the answer")
    ok = {**turn1, "messages": [*turn1["messages"],
                                {"role": "assistant",
                                 "content": "<think>long reasoning</think> the answer"},
                                {"role": "user", "content": "second"}]}
    assert w.observe("a", ok).rewritten_tokens == 0
    w.answered("a", ok, "reply two")
    stripped = {**turn1, "messages": [*turn1["messages"],
                                      {"role": "assistant", "content": "the answer"},
                                      {"role": "user", "content": "second"},
                                      {"role": "assistant", "content": "reply two"},
                                      {"role": "user", "content": "third"}]}
    expected = sum(estimate_tokens(s) for s in (
        "assistant\x00<think>long reasoning</think> the answer\x00None",
        "user\x00second\x00None", "assistant\x00reply two\x00None"))
    assert w.observe("a", stripped).rewritten_tokens == expected


def test_editing_only_the_latest_turn_is_a_branch_not_a_rewrite():
    w = HistoryWatch()
    turn = chat("m", "first", system="S")
    w.observe("a", turn)
    w.answered("a", turn, "one")
    nxt = {**turn, "messages": [*turn["messages"], {"role": "assistant", "content": "one"},
                                {"role": "user", "content": "second"}]}
    w.observe("a", nxt)
    edited = {**nxt, "messages": [*nxt["messages"][:-1], {"role": "user", "content": "2nd"}]}
    assert w.observe("a", edited).rewritten_tokens == 0


def test_a_reworded_question_is_not_a_volatile_prefix():
    q = "what is the best programming language for 2023 and why do people like it so much"
    assert volatile_span(f"S. {q}", f"S. Could you help with this: {q}") is None
    uuid_a = "Session 3f1c2a9e-8b7d-4c6e-9f00-1a2b3c4d5e6f. "
    uuid_b = "Session 9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b. "
    rest = "Answer as the ACME support agent, politely and briefly, citing policy. " * 2
    assert volatile_span(uuid_a + rest, uuid_b + rest).startswith("9e8d7c6b")


DOC = ("The warranty covers parts and labour for two years from delivery; "
       "batteries are covered for one year. ") * 96  # 9,600 characters: 2,400 tokens
QUESTIONS = ("What does the warranty cover?", "How long are batteries covered?",
             "Is labour included?")


def _doc_question(q: str) -> dict:
    return {"model": CLAUDE, "max_tokens": 16, "temperature": 0, "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": DOC, "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": q}]}]}


def test_a_messages_clients_document_breakpoint_reads_as_much_as_sent_directly(emulators):
    direct_emu, direct_url = emulators("anthropic")
    emu, url = emulators("anthropic")
    gw = make_gateway([("an", url, "anthropic", (CLAUDE,))])

    async def go_direct():
        async with httpx.AsyncClient(timeout=60) as c:
            return [(await c.post(direct_url + "/v1/messages", json=_doc_question(q),
                                  headers={"x-api-key": "sk-a"})).json()["usage"]
                    for q in QUESTIONS]

    async def go_gateway(c):
        out = []
        for q in QUESTIONS:
            r = await c.post("/v1/messages", json=_doc_question(q), headers=A)
            assert r.status_code == 200, r.text
            out.append(r.json()["usage"])
        return out

    direct = [u["cache_read_input_tokens"] for u in asyncio.run(go_direct())]
    via = [u["cache_read_input_tokens"] for u in run(go_gateway, gw)]
    assert direct[0] == 0 and direct[1] == direct[2] > estimate_tokens(DOC)
    assert via == direct
    sent = emu.bodies[0]["messages"][0]["content"]
    assert [b["text"] for b in sent] == [DOC, QUESTIONS[0]]  # as sent, two blocks
    assert sent[0]["cache_control"] == {"type": "ephemeral"}  # the client's, untouched
    assert sent[1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}  # the gateway's


def _two_blocks(model: str) -> dict:
    return {"model": model, "max_tokens": 16, "temperature": 0,
            "system": [{"type": "text", "text": "Sys A."}, {"type": "text", "text": "Sys B."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Q1."},
                                                      {"type": "text", "text": "Q2."}]}]}


def test_text_blocks_keep_their_boundaries_to_every_upstream(emulators):
    an, an_url = emulators("anthropic")
    oa, oa_url = emulators("openai")
    gw = make_gateway([("an", an_url, "anthropic", (CLAUDE,)),
                       ("oa", oa_url, "openai", ("gpt-4.1",))])
    joined = {**_two_blocks(CLAUDE), "system": "Sys A.Sys B.",
              "messages": [{"role": "user", "content": "Q1.Q2."}]}
    chat_parts = {"model": CLAUDE, "max_tokens": 16, "temperature": 0, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Sys A."},
                                       {"type": "text", "text": "Sys B."}]},
        {"role": "user", "content": [{"type": "text", "text": "Q1."},
                                     {"type": "text", "text": "Q2.",
                                      "cache_control": {"type": "ephemeral"}}]}]}

    async def go(c):
        for path, body in (("/v1/messages", _two_blocks(CLAUDE)), ("/v1/messages", joined),
                           ("/v1/chat/completions", chat_parts),
                           ("/v1/messages", _two_blocks("gpt-4.1"))):
            r = await c.post(path, json=body, headers=A)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["cache_layer"] == "miss"  # no two share an exact key

    run(go, gw)
    assert an.calls == 3 and oa.calls == 1
    assert an.bodies[0]["system"] == _two_blocks(CLAUDE)["system"]
    assert an.bodies[0]["messages"] == _two_blocks(CLAUDE)["messages"]
    assert an.bodies[1]["system"] == [{"type": "text", "text": "Sys A.Sys B."}]
    assert an.bodies[2]["system"] == _two_blocks(CLAUDE)["system"]
    assert an.bodies[2]["messages"][0]["content"] == chat_parts["messages"][1]["content"]
    assert oa.bodies[0]["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "Sys A."},
                                       {"type": "text", "text": "Sys B."}]},
        {"role": "user", "content": [{"type": "text", "text": "Q1."},
                                     {"type": "text", "text": "Q2."}]}]


def test_the_clients_breakpoints_stay_and_the_gateway_only_fills_free_slots():
    long = "x" * 8000  # 2,000 tokens
    msg = {"system": [{"type": "text", "text": long,
                       "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
           "messages": [{"role": "user", "content": [
               {"type": "text", "text": "doc " * 1000,
                "cache_control": {"type": "ephemeral", "ttl": "5m"}},
               {"type": "text", "text": "question"}]}]}
    assert place_breakpoints(msg, "1h", 1024) == ["turn"]
    blocks = msg["messages"][0]["content"]
    assert msg["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
    assert blocks[0]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}
    assert blocks[1]["cache_control"] == {"type": "ephemeral", "ttl": "5m"}  # 1h before 5m
    four = {"system": long, "messages": [{"role": "user", "content": [
        {"type": "text", "text": f"part {i} " * 300, "cache_control": {"type": "ephemeral"}}
        for i in range(4)] + [{"type": "text", "text": "q"}]}]}
    assert place_breakpoints(four, "5m", 1024) == []  # no slot left
    assert "cache_control" not in four["system"][0]
    auto = {"cache_control": {"type": "ephemeral"}, "system": long,
            "messages": [{"role": "user", "content": "q"}]}
    assert place_breakpoints(auto, "5m", 1024) == []  # the provider's automatic mode
