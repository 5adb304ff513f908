"""``POST /v1/messages`` on our server: Anthropic Messages over the chat path, with
``cache_control`` as the pin TTL and cache usage in Anthropic's fields."""
from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from prefixcache.server.messages import translate, usage_of
from tests.server.live import expected_hit, unique_prompt


def _msg(system: str, user: str = "what is a page?", **kw) -> dict:
    return {"model": "tiny", "max_tokens": 4, "temperature": 0, "system": system,
            "messages": [{"role": "user", "content": user}], **kw}


def _sse(text: str) -> list[dict]:
    return [json.loads(ln[6:]) for ln in text.split("\n") if ln.startswith("data: ")]


def test_messages_answer_with_cache_read_and_creation_usage(server):
    system = [{"type": "text", "text": unique_prompt(),
               "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    r1 = httpx.post(server.base + "/v1/messages", json=_msg(system), timeout=60)
    r2 = httpx.post(server.base + "/v1/messages", json=_msg(system), timeout=60)
    assert r1.status_code == r2.status_code == 200
    d1, u1, u2 = r1.json(), r1.json()["usage"], r2.json()["usage"]
    assert d1["type"] == "message" and d1["role"] == "assistant"
    assert d1["stop_reason"] == "max_tokens" and d1["content"][0]["type"] == "text"
    assert u1["output_tokens"] == 4 and u1["cache_read_input_tokens"] == 0
    total = u1["input_tokens"] + u1["cache_creation_input_tokens"]
    assert u1["cache_creation"] == {"ephemeral_5m_input_tokens": 0,
                                    "ephemeral_1h_input_tokens": total}
    assert u2["cache_read_input_tokens"] == expected_hit(total)
    assert u2["cache_read_input_tokens"] + u2["cache_creation_input_tokens"] == total


def test_without_a_breakpoint_nothing_is_reported_as_written(server):
    r = httpx.post(server.base + "/v1/messages", json=_msg(unique_prompt()), timeout=60)
    u = r.json()["usage"]
    assert u["cache_creation_input_tokens"] == 0 and u["input_tokens"] > 0


def test_messages_stream_as_anthropic_events(server):
    r = httpx.post(server.base + "/v1/messages", json=_msg(unique_prompt(), stream=True),
                   timeout=60)
    events = _sse(r.text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    assert events[-2]["usage"]["output_tokens"] == 4


def test_bad_messages_get_anthropic_errors_naming_the_field(server):
    cases = [({**_msg("s"), "max_tokens": 0}, "max_tokens"),
             ({**_msg("s"), "messages": [{"role": "user", "content": [{"type": "image"}]}]},
              "messages[0].content[0]"),
             ({**_msg([{"type": "text", "text": "s", "cache_control": {"ttl": "2h"}}])},
              "system[0].cache_control")]
    for body, param in cases:
        r = httpx.post(server.base + "/v1/messages", json=body, timeout=60)
        assert r.status_code == 400, param
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "invalid_request_error"
    before = _rejected(server, "404")
    r = httpx.post(server.base + "/v1/messages", json={**_msg("s"), "model": "nope"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert _rejected(server, "404") == before + 1


def _rejected(server, code: str) -> float:
    text = httpx.get(server.base + "/metrics", timeout=60).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("requests_rejected_total") and \
                    sample.labels.get("code") == code:
                return sample.value
    return 0.0


def test_translation_maps_the_longest_ttl_and_the_usage():
    body = _msg([{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}])
    body["messages"][0]["content"] = [{"type": "text", "text": "q",
                                       "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    req, ttl, _ = translate(json.dumps(body).encode())
    assert ttl == 3600.0 and req.messages[0].content == "s" and req.max_tokens == 4
    u = usage_of({"prompt_tokens": 40, "completion_tokens": 3,
                  "prompt_tokens_details": {"cached_tokens": 32}}, 300.0)
    assert (u["input_tokens"], u["cache_read_input_tokens"],
            u["cache_creation_input_tokens"]) == (0, 32, 8)
    assert u["cache_creation"]["ephemeral_5m_input_tokens"] == 8
