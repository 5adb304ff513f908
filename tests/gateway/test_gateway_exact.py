"""Layer 1: the exact cache, its isolation, bypass, single-flight and what is stored."""
from __future__ import annotations

import asyncio

from prefixcache.gateway.policy import TenantPolicy
from tests.gateway.conftest import A, B, CountingFlights, chat, make_gateway, run, sse_data

M = "gpt-4.1"


def _gw(url, **kw):
    return make_gateway([("oa", url, "openai", (M,))], **kw)


def test_a_repeat_is_served_by_layer_1_and_the_upstream_is_called_once(emulators):
    emu, url = emulators("openai")

    async def go(c):
        r1 = await c.post("/v1/chat/completions", json=chat(M, "hi"), headers=A)
        r2 = await c.post("/v1/chat/completions", json=chat(M, "hi"), headers=A)
        return r1, r2

    r1, r2 = run(go, _gw(url))
    assert r1.status_code == r2.status_code == 200
    assert r1.headers["x-prefixcache-cache"] == "miss"
    assert r2.headers["x-prefixcache-cache"] == "exact"
    assert r2.json()["usage"]["cache_layer"] == "exact"
    assert r1.json()["choices"][0]["message"] == r2.json()["choices"][0]["message"]
    assert emu.calls == 1


def test_tenant_b_never_gets_tenant_a_answer_and_no_key_is_revealed(emulators):
    emu, url = emulators("openai")

    async def go(c):
        ra = await c.post("/v1/chat/completions", json=chat(M, "secret?"), headers=A)
        rb = await c.post("/v1/chat/completions", json=chat(M, "secret?"), headers=B)
        return ra, rb

    ra, rb = run(go, _gw(url))
    assert ra.headers["x-prefixcache-cache"] == "miss"
    assert rb.headers["x-prefixcache-cache"] == "miss"
    assert emu.calls == 2
    for r in (ra, rb):
        shown = r.text + "".join(f"{k}:{v}" for k, v in r.headers.items())
        assert "sk-a" not in shown and "sk-b" not in shown
    # the upstream never sees the clients' keys either
    assert all("sk-" not in str(b) for b in emu.bodies)


def test_another_system_prompt_or_tool_set_misses(emulators):
    emu, url = emulators("openai")
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    tool2 = {"type": "function", "function": {"name": "g", "parameters": {}}}
    bodies = [chat(M, "same", system="S1"), chat(M, "same", system="S2"),
              chat(M, "same", system="S1", tools=[tool]),
              chat(M, "same", system="S1", tools=[tool, tool2]),
              chat(M, "same", system="S1", tools=[tool2, tool]),
              chat(M, "same", system="S1", max_tokens=17)]

    async def go(c):
        return [await c.post("/v1/chat/completions", json=b, headers=A) for b in bodies]

    rs = run(go, _gw(url))
    assert [r.headers["x-prefixcache-cache"] for r in rs] == ["miss"] * len(bodies)
    assert emu.calls == len(bodies)


def test_sampled_requests_bypass_unless_the_tenant_opts_in(emulators):
    emu, url = emulators("openai")
    body = chat(M, "roll", temperature=0.7)

    async def go(c):
        return [(await c.post("/v1/chat/completions", json=body, headers=h)).headers[
            "x-prefixcache-cache"] for h in (B, B, A, A)]

    layers = run(go, _gw(url, policies={"alice": TenantPolicy(cache_sampled=True)}))
    assert layers == ["bypass", "bypass", "miss", "exact"]
    assert emu.calls == 3


def test_a_stream_is_stored_and_replayed_as_sse_in_both_wire_formats(emulators):
    emu, url = emulators("openai")

    async def go(c):
        s1 = await c.post("/v1/chat/completions", json=chat(M, "s", stream=True), headers=A)
        s2 = await c.post("/v1/chat/completions", json=chat(M, "s", stream=True), headers=A)
        j3 = await c.post("/v1/chat/completions", json=chat(M, "s"), headers=A)
        m4 = await c.post("/v1/messages", json={"model": M, "max_tokens": 16, "temperature": 0,
                                                "messages": [{"role": "user", "content": "s"}],
                                                "stream": True}, headers=A)
        return s1, s2, j3, m4

    s1, s2, j3, m4 = run(go, _gw(url))
    text = lambda r: "".join((c["choices"][0]["delta"].get("content") or "")  # noqa: E731
                             for c in sse_data(r.text) if c.get("choices"))
    assert [r.headers["x-prefixcache-cache"] for r in (s1, s2, j3, m4)] == [
        "miss", "exact", "exact", "exact"]
    answer = j3.json()["choices"][0]["message"]["content"]
    assert text(s1) == text(s2) == answer and answer.startswith("[openai] answer ")
    assert s2.text.rstrip().endswith("data: [DONE]")
    deltas = [e["delta"]["text"] for e in sse_data(m4.text) if e["type"] ==
              "content_block_delta"]
    assert "".join(deltas) == answer
    assert sse_data(m4.text)[-1] == {"type": "message_stop"}
    assert emu.calls == 1


def test_a_stampede_of_20_identical_misses_makes_one_upstream_call(emulators):
    # the upstream answers once all 20 have missed the store (a fixed delay can end
    # before the last of them arrives on a loaded machine)
    emu, url = emulators("openai", hold=lambda n: flights.claims == 20)
    gw = _gw(url)
    gw.flights = flights = CountingFlights()

    async def go(c):
        return await asyncio.gather(*[c.post("/v1/chat/completions", json=chat(M, "herd"),
                                             headers=A) for _ in range(20)])

    rs = run(go, gw)
    assert emu.calls == 1
    assert {r.status_code for r in rs} == {200}
    assert len({r.json()["choices"][0]["message"]["content"] for r in rs}) == 1
    layers = sorted(r.headers["x-prefixcache-cache"] for r in rs)
    assert layers == ["exact"] * 19 + ["miss"]


def test_when_the_leader_fails_a_follower_retries(emulators):
    # each upstream call is answered once the others follow it: 5 claims for the first
    # leader, then 4 more when the followers retry (one of them leads)
    emu, url = emulators("openai", hold=lambda n: flights.claims == (5, 9)[n])
    emu.faults = ["500"]
    gw = _gw(url)
    gw.flights = flights = CountingFlights()

    async def go(c):
        return await asyncio.gather(*[c.post("/v1/chat/completions", json=chat(M, "retry"),
                                             headers=A) for _ in range(5)])

    rs = run(go, gw)
    assert sorted(r.status_code for r in rs) == [200, 200, 200, 200, 502]
    assert emu.calls == 2
    assert len(gw.flights) == 0


def test_finish_reasons_outside_the_policy_are_not_stored(emulators):
    emu, url = emulators("openai")

    async def go(c):
        return [(await c.post("/v1/chat/completions", json=chat(M, "x"), headers=A)).headers[
            "x-prefixcache-cache"] for _ in range(2)]

    gw = _gw(url, policies={"alice": TenantPolicy(store_finish_reasons=("length",))})
    assert run(go, gw) == ["miss", "miss"]
    assert emu.calls == 2 and len(gw.store) == 0


def test_equal_numbers_and_one_text_part_share_the_layer_1_entry(emulators):
    emu, url = emulators("openai")
    part = [{"type": "text", "text": "hi"}]
    bodies = [chat(M, "hi"), chat(M, "hi", temperature=0.0), chat(M, part),
              chat(M, "hi", top_p=1), chat(M, "hi", top_p=1.0), chat(M, "hi", top_p=0.5),
              chat(M, part + part), chat(M, [{**part[0], "cache_control": {"type": "x"}}])]

    async def go(c):
        return [await c.post("/v1/chat/completions", json=b, headers=A) for b in bodies]

    rs = run(go, _gw(url))
    assert [r.status_code for r in rs] == [200] * 8
    assert [r.headers["x-prefixcache-cache"] for r in rs] == [
        "miss", "exact", "exact", "miss", "exact", "miss", "miss", "miss"]
    assert [r.json()["usage"]["cache_layer"] for r in rs[:3]] == ["miss", "exact", "exact"]
    assert emu.calls == 5
    assert emu.bodies[0]["messages"][0]["content"] == "hi"  # forwarded as sent


def test_messages_client_one_text_block_hits_the_string_form(emulators):
    emu, url = emulators("anthropic")
    model = "claude-sonnet-4-5"
    gw = make_gateway([("cl", url, "anthropic", (model,))])
    base = {"model": model, "max_tokens": 16, "temperature": 0}

    async def go(c):
        out = [await c.post("/v1/messages", json={
            **base, "messages": [{"role": "user", "content": "hi"}]}, headers=A)]
        out.append(await c.post("/v1/messages", json={
            **base, "temperature": 0.0,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            headers=A))
        out.append(await c.post("/v1/chat/completions", json=chat(
            model, [{"type": "text", "text": "hi"}]), headers=A))
        return out

    rs = run(go, gw)
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert [r.headers["x-prefixcache-cache"] for r in rs] == ["miss", "exact", "exact"]
    assert emu.calls == 1


def test_key_canonicalisation_keeps_bools_and_template_rendered_parts_distinct():
    from prefixcache.gateway.exact import exact_key

    text = {"model": M, "messages": [{"role": "user", "content": "hi"}]}
    part = {"model": M, "messages": [{"role": "user",
                                      "content": [{"type": "text", "text": "hi"}]}]}
    assert exact_key("t", "chat", {**text, "seed": 1}) == exact_key(
        "t", "chat", {**text, "seed": 1.0})
    assert exact_key("t", "chat", {**text, "seed": 1}) != exact_key(
        "t", "chat", {**text, "seed": True})
    assert exact_key("t", "chat", {**text, "logprobs": False}) != exact_key(
        "t", "chat", {**text, "logprobs": 0})
    for provider in ("openai", "anthropic"):
        assert exact_key("t", "chat", text, provider) == exact_key("t", "chat", part,
                                                                   provider)
    # our engine and vLLM give the parts to the chat template: not the same request
    for provider in ("prefixcache", "vllm", "deepseek", None):
        assert exact_key("t", "chat", text, provider) != exact_key("t", "chat", part,
                                                                   provider)
