"""Pre-storing and pinning prefixes over HTTP (``max_tokens: 0``, ``cache_ttl``), the
per-tenant ``/v1/cache/pins`` endpoints, and the pin and quota gauges, with the real
openai and httpx clients against a live server."""
from __future__ import annotations

import httpx
import openai

from tests.server.live import BLOCK, expected_hit, labelled, unique_prompt


def _client(srv, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.v1, api_key=key, max_retries=0)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _prestore(srv, key: str, prompt: str, ttl="5m") -> dict:
    r = httpx.post(srv.v1 + "/completions", headers=_auth(key), timeout=60, json={
        "model": "tiny", "prompt": prompt, "max_tokens": 0, "cache_ttl": ttl})
    assert r.status_code == 200, r.text
    return r.json()


def _pins(srv, key: str) -> list[dict]:
    r = httpx.get(srv.v1 + "/cache/pins", headers=_auth(key), timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "list"
    return r.json()["data"]


def test_max_tokens_zero_prefills_pins_and_the_next_request_hits(tenant_server):
    alice = _client(tenant_server, "sk-alice")
    prompt = unique_prompt(40)
    body = _prestore(tenant_server, "sk-alice", prompt)
    choice, usage = body["choices"][0], body["usage"]
    assert (choice["text"], choice["finish_reason"], usage["completion_tokens"]) == (
        "", "length", 0)
    n = usage["prompt_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    pin = body["pins"][0]
    assert pin["pinned"] is True and pin["tokens"] == n // BLOCK * BLOCK
    assert pin["tier"] == "pool" and pin["ttl_s"] == 300.0
    r = alice.completions.create(model="tiny", prompt=prompt, max_tokens=2,
                                 extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens_details.cached_tokens == expected_hit(n) > 0
    # Without cache_ttl, max_tokens 0 is a plain prefill: no pin in the answer.
    r0 = alice.completions.create(model="tiny", prompt=unique_prompt(20), max_tokens=0)
    assert r0.choices[0].text == "" and r0.usage.completion_tokens == 0
    assert "pins" not in (r0.model_extra or {})
    # Anthropic's cache_control shape says the same (the 1h TTL), through the openai client.
    r1 = alice.completions.create(model="tiny", prompt=unique_prompt(20), max_tokens=0,
                                  extra_body={"cache_control": {"type": "ephemeral",
                                                                "ttl": "1h"}})
    assert r1.model_extra["pins"][0]["ttl_s"] == 3600.0
    # Streamed, max_tokens 0 ends at once with empty text and the usage.
    chunks = list(alice.completions.create(
        model="tiny", prompt=prompt, max_tokens=0, stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 0
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == expected_hit(n)
    tenant_server.wait_idle()


def test_pins_are_listed_and_unpinned_per_tenant(tenant_server):
    srv = tenant_server
    pin = _prestore(srv, "sk-alice", unique_prompt(30), ttl=120)["pins"][0]
    h = pin["prefix_hash"]
    mine = [p for p in _pins(srv, "sk-alice") if p["prefix_hash"] == h]
    assert len(mine) == 1 and mine[0]["tokens"] == pin["tokens"]
    assert mine[0]["ttl_s"] == 120.0 and mine[0]["object"] == "cache.pin"
    assert [p for p in _pins(srv, "sk-alice-2") if p["prefix_hash"] == h] == mine  # same tenant
    assert all(p["prefix_hash"] != h for p in _pins(srv, "sk-bob"))
    # Another tenant's hash is "not found", exactly like an unknown one.
    for key, target in (("sk-bob", h), ("sk-alice", "ab" * 16)):
        r = httpx.delete(f"{srv.v1}/cache/pins/{target}", headers=_auth(key), timeout=30)
        assert r.status_code == 404
        err = r.json()["error"]
        assert (err["code"], err["param"], err["type"]) == (
            "pin_not_found", "prefix_hash", "invalid_request_error")
    assert any(p["prefix_hash"] == h for p in _pins(srv, "sk-alice"))
    r = httpx.delete(f"{srv.v1}/cache/pins/not-hex", headers=_auth("sk-alice"), timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prefix_hash"
    assert httpx.get(srv.v1 + "/cache/pins", timeout=30).status_code == 401
    r = httpx.delete(f"{srv.v1}/cache/pins/{h}", headers=_auth("sk-alice"), timeout=30)
    assert r.status_code == 200 and r.json()["deleted"] is True
    assert all(p["prefix_hash"] != h for p in _pins(srv, "sk-alice"))
    r = httpx.delete(f"{srv.v1}/cache/pins/{h}", headers=_auth("sk-alice"), timeout=30)
    assert r.status_code == 404


def test_pin_and_tenant_gauges(tenant_server):
    srv = tenant_server
    before = srv.metrics()
    _prestore(srv, "sk-bob", unique_prompt(30))
    m = srv.wait_idle()
    assert m["kv_pins"] >= 1 and m["kv_pages_pinned"] >= 1 and m["kv_pin_cap_pages"] == 256
    assert m["kv_pins_made_total"] == before["kv_pins_made_total"] + 1
    assert labelled(m, "tenant_kv_quota_pages", tenant="bob") == 256
    assert labelled(m, "tenant_kv_pages", tenant="bob") > 0
    assert labelled(m, "tenant_kv_pages", tenant="ops") == 0
    assert not any(k.startswith("tenant_kv_quota_pages") and "alice" in k for k in m)


def test_delete_without_a_hash_is_a_400_naming_it(tenant_server):
    srv = tenant_server
    for path in ("/cache/pins/", "/cache/pins"):
        r = httpx.delete(srv.v1 + path, headers=_auth("sk-alice"), timeout=30)
        assert r.status_code == 400, (path, r.status_code)  # not a 307 redirect, not 405
        err = r.json()["error"]
        assert (err["type"], err["param"], err["code"]) == (
            "invalid_request_error", "prefix_hash", None)
        assert "prefix_hash is required" in err["message"]
        assert httpx.delete(srv.v1 + path, timeout=30).status_code == 401
    assert _pins(srv, "sk-alice") is not None  # still serving


def test_delete_with_a_blank_or_odd_hash_is_a_400_not_a_404(tenant_server):
    srv = tenant_server
    for raw in ("%20", "%20%20", "ab%20cd", "abc", "%09", "zz", "ab%0A"):
        r = httpx.delete(f"{srv.v1}/cache/pins/{raw}", headers=_auth("sk-alice"), timeout=30)
        assert r.status_code == 400, (raw, r.status_code, r.text)
        err = r.json()["error"]
        assert (err["type"], err["param"], err["code"]) == (
            "invalid_request_error", "prefix_hash", None), raw
        assert "hex" in err["message"]
    assert _pins(srv, "sk-alice") is not None  # still serving


def test_cache_ttl_below_one_second_is_a_400_and_pins_nothing(tenant_server):
    srv = tenant_server
    alice = _client(srv, "sk-alice")
    before = _pins(srv, "sk-alice")
    prompt = unique_prompt(30)
    for ttl in (1e-9, 0.5, "0.5s"):
        try:
            alice.completions.create(model="tiny", prompt=prompt, max_tokens=0,
                                     extra_body={"cache_ttl": ttl})
        except openai.BadRequestError as exc:
            assert exc.status_code == 400
            err = exc.body
            assert (err["param"], err["type"]) == ("cache_ttl", "invalid_request_error")
            assert "from 1 s to 604800 s" in err["message"]
        else:
            raise AssertionError(f"cache_ttl {ttl!r} was accepted")
    assert _pins(srv, "sk-alice") == before  # no pin was made
    bob = _client(srv, "sk-bob")
    r = bob.completions.create(model="tiny", prompt=prompt, max_tokens=0,
                               extra_body={"cache_ttl": 1})  # the least TTL: pinned
    pin = r.model_extra["pins"][0]
    assert (pin["pinned"], pin["ttl_s"]) == (True, 1.0)
    srv.wait_idle()
