"""Upstream failures: timeouts, 5xx, a stream broken or cut short. The client gets an
OpenAI- or Anthropic-style error and nothing is stored."""
from __future__ import annotations

import pytest

from tests.gateway.conftest import A, chat, make_gateway, run, sse_data

M = "gpt-4.1"
UPSTREAM_TIMEOUT_S = 3.0
MSG = {"model": M, "max_tokens": 16, "temperature": 0,
       "messages": [{"role": "user", "content": "fail?"}]}


@pytest.mark.parametrize("client", ["chat", "messages"])
@pytest.mark.parametrize("fault, status, code", [("500", 502, "upstream_error"),
                                                  ("timeout", 504, "upstream_timeout")])
def test_a_failed_call_answers_an_error_in_the_client_format_and_stores_nothing(
        emulators, client, fault, status, code):
    # the same time budget serves the good call after the bad one: long enough that a
    # loaded machine never exceeds it there, and the hang twice as long
    emu, url = emulators("openai", hang_s=2 * UPSTREAM_TIMEOUT_S)
    emu.faults = [fault]
    path, body = (("/v1/chat/completions", chat(M, "fail?")) if client == "chat"
                  else ("/v1/messages", MSG))

    async def go(c):
        return [await c.post(path, json=body, headers=A) for _ in range(2)]

    gw = make_gateway([("oa", url, "openai", (M,))], timeout_s=UPSTREAM_TIMEOUT_S)
    bad, good = run(go, gw)
    assert bad.status_code == status
    if client == "chat":
        assert bad.json()["error"]["code"] == code
        assert bad.json()["error"]["type"] == "server_error"
    else:
        assert bad.json()["type"] == "error" and bad.json()["error"]["type"] == "api_error"
    assert good.status_code == 200 and good.headers["x-prefixcache-cache"] == "miss"
    assert emu.calls == 2
    assert len(gw.flights) == 0
    assert gw.metrics.tenants["alice"].requests["error"] == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("fault", ["disconnect", "truncate"])
def test_a_broken_stream_ends_with_an_error_event_and_is_not_stored(emulators, provider,
                                                                    fault):
    emu, url = emulators(provider)
    emu.faults = [fault]
    model = "claude-sonnet-4-5" if provider == "anthropic" else M

    async def go(c):
        s = await c.post("/v1/chat/completions", json=chat(model, "cut", stream=True),
                         headers=A)
        m = await c.post("/v1/messages", json={**MSG, "model": model, "stream": True},
                         headers=A)
        again = await c.post("/v1/chat/completions", json=chat(model, "cut"), headers=A)
        return s, m, again

    emu.faults = [fault, fault]
    gw = make_gateway([("up", url, provider, (model,))])
    s, m, again = run(go, gw)
    events = sse_data(s.text)
    assert events[-1]["error"]["code"] in ("upstream_disconnected", "upstream_error")
    assert s.text.rstrip().endswith("data: [DONE]")
    assert "event: error" in m.text
    assert again.headers["x-prefixcache-cache"] == "miss"
    assert emu.calls == 3 and len(gw.store) == 1  # only the complete answer
    assert len(gw.flights) == 0


def test_bad_input_names_the_parameter(emulators):
    _, url = emulators("openai")

    async def go(c):
        return [await c.post("/v1/chat/completions", json={"messages": []}, headers=A),
                await c.post("/v1/chat/completions", json=chat("nope", "x"), headers=A),
                await c.post("/v1/chat/completions", content=b"{", headers=A),
                await c.post("/v1/chat/completions", json=chat(M, "x")),
                await c.post("/v1/messages", json={**MSG, "messages": [{"role": "bot"}]},
                             headers=A)]

    empty, unknown, broken, nokey, badrole = run(go, make_gateway([("oa", url, "openai",
                                                                    (M,))]))
    assert (empty.status_code, empty.json()["error"]["param"]) == (400, "messages")
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "model_not_found")
    assert broken.status_code == 400 and "not valid JSON" in broken.json()["error"]["message"]
    assert nokey.status_code == 401 and nokey.json()["error"]["code"] == "invalid_api_key"
    assert badrole.status_code == 400 and badrole.json()["type"] == "error"


def test_a_stream_dropped_before_it_starts_releases_its_flight(emulators):
    emu, url = emulators("openai")
    gw = make_gateway([("oa", url, "openai", (M,))])

    async def go(c):
        out = await gw.handle("alice", "chat", chat(M, "drop", stream=True))
        assert len(gw.flights) == 1 and out.close is not None
        await out.close()  # the client went away: the relay never ran
        assert len(gw.flights) == 0 and len(gw.store) == 0
        again = await c.post("/v1/chat/completions", json=chat(M, "drop"), headers=A)
        return again

    again = run(go, gw)
    assert again.headers["x-prefixcache-cache"] == "miss" and emu.calls == 2


def test_requests_for_several_answers_are_refused_naming_the_field(emulators):
    _, url = emulators("openai")

    async def go(c):
        return (await c.post("/v1/chat/completions", json=chat(M, "x", n=2), headers=A),
                await c.post("/v1/completions", json={"model": M, "prompt": ["a", "b"]},
                             headers=A))

    n2, many = run(go, make_gateway([("oa", url, "openai", (M,))]))
    assert (n2.status_code, n2.json()["error"]["param"]) == (400, "n")
    assert (many.status_code, many.json()["error"]["param"]) == (400, "prompt")
