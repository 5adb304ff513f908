"""Layer 3: breakpoints reach the emulated Anthropic upstream, cache reads rise from turn
2; OpenAI prompt_cache_key; TTL from reuse; volatile prefixes and rewritten history."""
from __future__ import annotations

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
