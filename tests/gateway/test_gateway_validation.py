"""Bad request bodies get a 400 in the client's wire format naming the parameter (an
OpenAI error object, or an Anthropic ``invalid_request_error`` on ``/v1/messages``), a bug
gets a JSON 500 in that format, and the gateway keeps serving; nothing is forwarded."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from prefixcache.gateway.completion import UpstreamError
from prefixcache.gateway.validate import MAX_DEPTH
from tests.gateway.conftest import A, make_gateway, run, sse_data

M = "gpt-4.1"
CLAUDE = "claude-sonnet-4-5"
BASE = {"chat": ("/v1/chat/completions", {"model": M, "max_tokens": 3, "messages": [
            {"role": "user", "content": "x"}]}),
        "completions": ("/v1/completions", {"model": M, "max_tokens": 3, "prompt": "x"}),
        "messages": ("/v1/messages", {"model": CLAUDE, "max_tokens": 3, "messages": [
            {"role": "user", "content": "x"}]})}


def _deep(n: int) -> dict:
    out: dict = {}
    for _ in range(n):
        out = {"a": out}
    return out


def _post_all(emulators, bodies: list[tuple[str, bytes]], provider: str = "openai"):
    """POST each ``(path, raw body)``, then one good chat request; the emulator's calls."""
    emu, url = emulators(provider)
    models = (M, CLAUDE)

    async def go(c: httpx.AsyncClient):
        out = [await c.post(p, content=raw, headers={**A, "content-type": "application/json"})
               for p, raw in bodies]
        out.append(await c.post("/v1/chat/completions", json={**BASE["chat"][1],
                                "model": models[provider == "anthropic"]}, headers=A))
        return out

    return run(go, make_gateway([("up", url, provider, models)])), emu


def _assert_400(client: str, r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    if client == "messages":
        assert body["type"] == "error" and set(body) == {"type", "error"}
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith(f"{param}: ")
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["param"] == param
        assert body["error"]["message"].startswith(f"{param}: ")


BAD = [  # (field overrides or a raw-text edit, the parameter named)
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": 5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": "x"}, "top_p"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"max_tokens": "3"}, "max_tokens"),
    ({"n": 2}, "n"),
    ({"n": "two"}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"tools": "x"}, "tools"),
    ({"tools": ["x"]}, "tools[0]"),
    ({"tools": [{}]}, "tools[0]"),
    ({"metadata": "m"}, "metadata"),
    ({"metadata": _deep(MAX_DEPTH + 1)}, "metadata"),
    ('"temperature": NaN', "temperature"),
    ('"temperature": Infinity', "temperature"),
    ('"temperature": 1e999', "temperature"),
    ('"metadata": {"x": [-Infinity]}', "metadata.x[0]"),
]


@pytest.mark.parametrize("client", ["chat", "completions", "messages"])
def test_bad_fields_are_400s_in_the_client_format_naming_the_parameter(emulators, client):
    path, base = BASE[client]
    bodies = []
    for edit, _ in BAD:
        if isinstance(edit, str):
            raw = json.dumps(base)[:-1] + ", " + edit + "}"
        else:
            raw = json.dumps({**base, **edit})
        bodies.append((path, raw.encode()))
    answers, emu = _post_all(emulators, bodies)
    for (_, param), r in zip(BAD, answers):
        _assert_400(client, r, param)
    assert answers[-1].status_code == 200  # still serving
    assert emu.calls == 1  # nothing bad was forwarded


@pytest.mark.parametrize("client", ["chat", "completions", "messages"])
def test_a_body_nested_5000_levels_is_a_400_not_a_recursion_error(emulators, client):
    path, base = BASE[client]
    raw = json.dumps(base)[:-1] + ', "metadata": ' + '{"a": ' * 5000 + "1" + "}" * 5001
    answers, emu = _post_all(emulators, [(path, raw.encode())])
    r = answers[0]
    assert r.status_code == 400 and "nested deeper than" in r.text
    assert answers[-1].status_code == 200 and emu.calls == 1


@pytest.mark.parametrize("client, messages, param", [
    ("chat", [{"content": "no role"}], "messages[0].role"),
    ("chat", [{"role": "wizard", "content": "x"}], "messages[0].role"),
    ("chat", ["hello"], "messages[0]"),
    ("chat", [{"role": "user", "content": 7}], "messages[0].content"),
    ("chat", [{"role": "user", "content": [{"text": "no type"}]}], "messages[0].content"),
    ("chat", [{"role": "assistant", "content": None, "tool_calls": "x"}],
     "messages[0].tool_calls"),
    ("chat", [], "messages"),
    ("chat", "x", "messages"),
    ("messages", [{"content": "no role"}], "messages[0].role"),
    ("messages", [{"role": "user", "content": 7}], "messages[0].content"),
    ("messages", [], "messages"),
])
def test_bad_messages_are_400s_naming_the_message(emulators, client, messages, param):
    path, base = BASE[client]
    answers, emu = _post_all(emulators, [(path, json.dumps({**base, "messages": messages})
                                          .encode())])
    _assert_400(client, answers[0], param)
    assert answers[-1].status_code == 200 and emu.calls == 1


def test_negative_max_tokens_is_never_forwarded_nor_cached_for_messages(emulators):
    """The reported sequence: chat with max_tokens -3 was answered 200, then the same body
    on /v1/messages got an exact hit. Both are 400 now."""
    chat = {**BASE["chat"][1], "model": CLAUDE, "temperature": 0, "max_tokens": -3}
    msg = {**BASE["messages"][1], "temperature": 0, "max_tokens": -3}
    answers, emu = _post_all(emulators, [("/v1/chat/completions", json.dumps(chat).encode()),
                                         ("/v1/messages", json.dumps(msg).encode())],
                             provider="anthropic")
    _assert_400("chat", answers[0], "max_tokens")
    _assert_400("messages", answers[1], "max_tokens")
    assert emu.calls == 1


def test_max_tokens_0_on_completions_passes_only_for_our_engine():
    """A prefill (max_tokens 0) is our engine's; other upstreams get a 400 first."""
    gw = make_gateway([("pc", "http://127.0.0.1:9", "prefixcache", ("ours",)),
                       ("oa", "http://127.0.0.1:9", "openai", (M,))], timeout_s=1.0)

    async def go():
        try:
            with pytest.raises(UpstreamError):  # validated, then forwarded (nobody there)
                await gw.handle("alice", "completions",
                                {"model": "ours", "prompt": "x", "max_tokens": 0})
            for body in ({"model": M, "prompt": "x", "max_tokens": 0},
                         {"model": "ours", "prompt": "x", "max_tokens": -1}):
                r = await _status(gw, body)
                assert r == (400, "max_tokens")
        finally:
            await gw.upstreams[0].client.aclose()

    asyncio.run(go())


async def _status(gw, body: dict) -> tuple[int, str | None]:
    from prefixcache.gateway.requests import BadRequest

    try:
        await gw.handle("alice", "completions", body)
    except BadRequest as exc:
        return exc.status, exc.param
    return 200, None


@pytest.mark.parametrize("client", ["chat", "completions", "messages"])
def test_a_bug_answers_a_json_500_in_the_client_format_and_the_next_request_is_served(
        emulators, client, caplog):
    _, url = emulators("openai")
    gw = make_gateway([("oa", url, "openai", (M, CLAUDE))])
    real = gw.handle
    calls = []

    async def flaky(*a, **kw):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return await real(*a, **kw)

    gw.handle = flaky  # type: ignore[method-assign]
    path, base = BASE[client]

    async def go(c):
        return [await c.post(path, json={**base, "temperature": 0}, headers=A),
                await c.post("/v1/chat/completions", json=BASE["chat"][1], headers=A)]

    with caplog.at_level("ERROR", logger="prefixcache.gateway.app"):
        bad, good = run(go, gw)
    assert bad.status_code == 500 and bad.headers["content-type"] == "application/json"
    if client == "messages":
        assert bad.json()["type"] == "error" and bad.json()["error"]["type"] == "api_error"
    else:
        assert bad.json()["error"]["type"] == "server_error"
        assert bad.json()["error"]["code"] == "internal_error"
    assert "a bug" not in bad.text  # the traceback is in the log, not the answer
    assert "RuntimeError: a bug" in caplog.text
    assert good.status_code == 200


@pytest.mark.parametrize("client", ["chat", "messages"])
def test_a_bug_mid_stream_ends_it_with_an_error_event_and_the_gateway_keeps_serving(
        emulators, client, caplog):
    _, url = emulators("openai")
    gw = make_gateway([("oa", url, "openai", (M, CLAUDE))])

    async def broken_set(*a, **kw):
        raise RuntimeError("a store bug")

    gw.store.set = broken_set  # type: ignore[method-assign]
    path, base = BASE[client]

    async def go(c):
        return [await c.post(path, json={**base, "temperature": 0, "stream": True},
                             headers=A),
                await c.post("/v1/chat/completions", json=BASE["chat"][1], headers=A)]

    with caplog.at_level("ERROR", logger="prefixcache.gateway.render"):
        s, good = run(go, gw)
    assert s.status_code == 200 and "a store bug" not in s.text
    if client == "messages":
        assert "event: error" in s.text and '"type":"api_error"' in s.text.replace(" ", "")
    else:
        events = sse_data(s.text)
        assert events[-1]["error"]["code"] == "internal_error"
        assert events[-1]["error"]["type"] == "server_error"
        assert s.text.rstrip().endswith("data: [DONE]")
    assert "RuntimeError: a store bug" in caplog.text
    assert good.status_code == 200 and len(gw.flights) == 0
