"""End to end: the gateway in front of our real server (``builtin:tiny``), in both wire
formats, and the server's own ``POST /v1/messages``."""
from __future__ import annotations

import httpx
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


def test_the_server_answers_messages_with_cache_usage(engine):
    pinned = _msg("what is a page?")
    pinned["system"] = [{"type": "text", "text": SYSTEM,
                         "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    r1 = httpx.post(engine.base + "/v1/messages", json=pinned, timeout=60)
    r2 = httpx.post(engine.base + "/v1/messages", json=pinned, timeout=60)
    assert r1.status_code == r2.status_code == 200
    u1, u2 = r1.json()["usage"], r2.json()["usage"]
    assert r1.json()["type"] == "message" and r1.json()["stop_reason"] == "max_tokens"
    assert u1["output_tokens"] == 4 and u1["cache_read_input_tokens"] == 0
    assert u1["cache_creation"]["ephemeral_1h_input_tokens"] == u1[
        "cache_creation_input_tokens"] > 0
    total = u1["input_tokens"] + u1["cache_creation_input_tokens"]
    assert u2["cache_read_input_tokens"] == (total - 1) // 16 * 16  # full pages, not the last
    assert u2["cache_read_input_tokens"] + u2["cache_creation_input_tokens"] == total
    plain = httpx.post(engine.base + "/v1/messages", json=_msg("what is a page?"), timeout=60)
    assert plain.json()["usage"]["cache_creation_input_tokens"] == 0
    bad = httpx.post(engine.base + "/v1/messages", json={**_msg("x"), "max_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_the_server_streams_messages_events(engine):
    r = httpx.post(engine.base + "/v1/messages", json=_msg("stream it", stream=True),
                   timeout=60)
    events = sse_data(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-3:] == [
        "content_block_stop", "message_delta", "message_stop"]
    assert events[-2]["usage"]["output_tokens"] == 4


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
