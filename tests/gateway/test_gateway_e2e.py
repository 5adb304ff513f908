"""End to end: the gateway in front of our real server (``builtin:tiny``), in both wire
formats (the server's own ``POST /v1/messages``: tests/server/test_server_messages.py)."""
from __future__ import annotations

import pytest

from tests.gateway.conftest import A, B, make_gateway, run, sse_data
from tests.server.live import LiveServer

SYSTEM = "You answer questions about the prefixcache engine. " * 12


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    srv = LiveServer(["--served-model-name", "tiny"],
                     tmp_path_factory.mktemp("gw-e2e") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _msg(user: str, **kw) -> dict:
    return {"model": "tiny", "max_tokens": 4, "temperature": 0, "system": SYSTEM,
            "messages": [{"role": "user", "content": user}], **kw}


@pytest.mark.parametrize("wire", ["chat", "messages"])
def test_the_gateway_serves_our_engine_in_both_wire_formats(engine, wire):
    gw = make_gateway([("pc", engine.base, "prefixcache", ("tiny",))])
    path = "/v1/chat/completions" if wire == "chat" else "/v1/messages"
    system = f"{wire}: {SYSTEM}"  # a prefix no other test has published
    body = {**_msg("hello"), "system": system}
    if wire == "chat":
        body = {"model": "tiny", "max_tokens": 4, "temperature": 0, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": "hello"}]}

    async def go(c):
        rs = [await c.post(path, json=body, headers=h) for h in (A, A, B)]
        s = await c.post(path, json={**body, "stream": True}, headers=A)
        return rs, s

    (r1, r2, rb), s = run(go, gw)
    assert [r.headers["x-prefixcache-cache"] for r in (r1, r2, rb, s)] == [
        "miss", "exact", "miss", "exact"]
    text = (lambda r: r.json()["choices"][0]["message"]["content"]) if wire == "chat" else (
        lambda r: r.json()["content"][0]["text"])
    assert text(r1) == text(r2)
    usage = r1.json()["usage"]
    assert usage["cache_layer"] == "miss"
    # bob's prompt is computed under bob's namespace: no pages read from alice's
    cached = (rb.json()["usage"]["prompt_tokens_details"]["cached_tokens"] if wire == "chat"
              else rb.json()["usage"]["cache_read_input_tokens"])
    assert cached == 0
    assert gw.metrics.tenants["alice"].upstream_calls == 1


def test_the_gateway_serves_completions_from_our_engine(engine):
    gw = make_gateway([("pc", engine.base, "prefixcache", ("tiny",))])
    body = {"model": "tiny", "prompt": "completions through the gateway " * 4,
            "max_tokens": 3, "temperature": 0}

    async def go(c):
        r1 = await c.post("/v1/completions", json=body, headers=A)
        r2 = await c.post("/v1/completions", json={**body, "stream": True}, headers=A)
        return r1, r2

    r1, r2 = run(go, gw)
    assert r1.status_code == 200 and r1.json()["object"] == "text_completion"
    assert r1.json()["usage"]["completion_tokens"] == 3
    text = "".join(c["choices"][0]["text"] for c in sse_data(r2.text) if c.get("choices"))
    assert r2.headers["x-prefixcache-cache"] == "exact"
    assert text == r1.json()["choices"][0]["text"]
