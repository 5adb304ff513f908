"""Cache-miss diagnostics on the three HTTP APIs (real ``openai`` and ``httpx`` clients on
the live builtin:tiny servers): the reason constructed is the reason reported, the section
of a divergence is named, another tenant's response id is answered exactly like an
unknown one, and a request that does not ask gets no diagnosis and costs no work."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.helpers.wait import wait_until
from tests.server.live import BLOCK, KEYS, LiveServer, expected_hit, labelled, unique_prompt

ON = {"prompt_cache_diagnostics": True, "ignore_eos": True}
BETA = {"anthropic-beta": "cache-diagnosis-2026-04-07"}


def _client(srv, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.v1, api_key=key, max_retries=0)


def _complete(client: openai.OpenAI, prompt: str, **extra) -> tuple[str, dict]:
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2,
                                  extra_body={**ON, **extra})
    return r.id, r.model_extra["prompt_cache_diagnostics"]


def _chat(client: openai.OpenAI, messages: list, **extra) -> tuple[str, dict]:
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                       extra_body={**ON, **extra})
    return r.id, r.model_extra["prompt_cache_diagnostics"]


def _messages(srv, body: dict, headers: dict | None = None, key: str = "none") -> dict:
    r = httpx.post(f"{srv.base}/v1/messages", json={"model": "tiny", "max_tokens": 2, **body},
                   headers={"x-api-key": key, "authorization": f"Bearer {key}",
                            **(headers or {})}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_completions_reasons_and_position(server):
    c = _client(server)
    prompt = unique_prompt(40)
    rid, d = _complete(c, prompt)
    n = d["prompt_tokens"]
    assert (d["reason"], d["cached_tokens"], d["compared_with"]) == ("never_seen", 0, None)
    _, d = _complete(c, prompt)
    assert (d["reason"], d["cached_tokens"], d["compared_with"]) == (
        "none", expected_hit(n), rid)
    words = prompt.split()
    edited = " ".join(words[:30] + ["CHANGED"] + words[31:])
    _, d = _complete(c, edited, prompt_cache_diagnostics={"compare_to": rid})
    assert (d["reason"], d["compare_to_found"]) == ("prefix_changed", True)
    assert d["cached_tokens"] == d["reusable_tokens"] == d["divergence"]["token"] // BLOCK * BLOCK
    assert d["divergence"]["section"] == "prompt" and "CHANGED" in d["divergence"]["after"]
    assert prompt[:d["divergence"]["char"]] == edited[:d["divergence"]["char"]]
    _, d = _complete(c, prompt, cache_salt="other")
    assert (d["reason"], d["detail"]) == ("other_namespace", "cache_salt")
    _, d = _complete(c, "short one")
    assert d["reason"] == "shorter_than_one_page"
    assert httpx.post(f"{server.base}/reset_prefix_cache", timeout=30).status_code == 200
    _, d = _complete(c, prompt)
    assert (d["reason"], d["detail"], d["cached_tokens"]) == ("evicted", "reset", 0)


def test_chat_names_the_message_and_the_header_asks(server):
    c = _client(server)
    system = {"role": "system", "content": unique_prompt(30)}
    conv = [system, {"role": "user", "content": "Please explain prefix caching to me."}]
    rid, d = _chat(c, conv)
    assert d["reason"] == "never_seen"
    edited = [system, {"role": "user", "content": "Please explain suffix caching to me."}]
    _, d = _chat(c, edited, prompt_cache_diagnostics={"compare_to": rid})
    assert (d["reason"], d["divergence"]["section"]) == ("prefix_changed", "messages[1]")
    assert d["divergence"]["after"].startswith("suffix")
    assert d["divergence"]["earlier_after"].startswith("prefix")
    # the header, for clients that cannot add a field
    r = c.chat.completions.create(model="tiny", messages=conv, max_tokens=2,
                                  extra_headers={"X-Cache-Diagnostics": "1"})
    assert r.model_extra["prompt_cache_diagnostics"]["reason"] == "none"
    r = c.chat.completions.create(model="tiny", messages=conv, max_tokens=2)
    assert "prompt_cache_diagnostics" not in (r.model_extra or {})
    # a stream carries it in its last chunk (choices empty), with the usage when asked
    chunks = list(c.chat.completions.create(model="tiny", messages=conv, max_tokens=2,
                                            stream=True, extra_body=ON))
    last = chunks[-1]
    assert last.choices == [] and last.usage is None
    assert last.model_extra["prompt_cache_diagnostics"]["reason"] == "none"
    assert all("prompt_cache_diagnostics" not in (ch.model_extra or {}) for ch in chunks[:-1])


def test_messages_use_anthropic_types(server):
    system = unique_prompt(30)
    body = {"system": system, "messages": [{"role": "user", "content": "Hello there, friend."}]}
    first = _messages(server, body, BETA)
    assert first["diagnostics"]["cache_miss_reason"]["type"] == "never_seen"
    again = _messages(server, {**body, "diagnostics": {"previous_message_id": first["id"]}})
    assert again["diagnostics"]["cache_miss_reason"] is None
    assert again["diagnostics"]["prefixcache"]["compared_with"] == first["id"]
    changed = _messages(server, {**body, "system": "Now: " + system,
                                 "diagnostics": {"previous_message_id": first["id"]}})
    reason = changed["diagnostics"]["cache_miss_reason"]
    assert reason["type"] == "system_changed"
    assert reason["cache_missed_input_tokens"] == changed["usage"]["input_tokens"]
    msgs = _messages(server, {**body, "messages": [{"role": "user", "content": "Bye now."}],
                              "diagnostics": {"previous_message_id": first["id"]}})
    assert msgs["diagnostics"]["cache_miss_reason"]["type"] == "messages_changed"
    assert msgs["diagnostics"]["prefixcache"]["divergence"]["section"].startswith("messages[0]")
    gone = _messages(server, {**body, "diagnostics": {"previous_message_id": "msg_unknown"}})
    assert gone["diagnostics"]["cache_miss_reason"]["type"] == "previous_message_not_found"
    plain = _messages(server, body)
    assert "diagnostics" not in plain


def _stream_events(srv, body: dict, headers: dict) -> list[tuple[str, dict]]:
    out = []
    with httpx.stream("POST", f"{srv.base}/v1/messages", timeout=60, headers={
            "authorization": "Bearer none", **headers},
            json={"model": "tiny", "max_tokens": 2, "stream": True, **body}) as r:
        assert r.status_code == 200
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                out.append((event, json.loads(line[6:])))
    return out


def test_messages_streams_carry_diagnostics_in_message_delta(server):
    body = {"system": unique_prompt(30), "messages": [{"role": "user", "content": "Hi."}]}
    first = _messages(server, body, BETA)
    events = _stream_events(server, {**body, "system": "Now: " + body["system"],
                                     "diagnostics": {"previous_message_id": first["id"]}}, {})
    names = [e for e, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    delta = events[-2][1]
    reason = delta["diagnostics"]["cache_miss_reason"]
    assert reason["type"] == "system_changed"
    assert reason["cache_missed_input_tokens"] == events[0][1]["message"]["usage"][
        "input_tokens"] - delta["diagnostics"]["prefixcache"]["cached_tokens"]
    assert delta["diagnostics"]["prefixcache"]["compared_with"] == first["id"]
    plain = _stream_events(server, body, {})
    assert "diagnostics" not in plain[-2][1] and plain[-2][0] == "message_delta"


def test_another_tenants_response_is_not_found_like_an_unknown_id(tenant_server):
    alice, bob = _client(tenant_server, "sk-alice"), _client(tenant_server, "sk-bob")
    prompt = unique_prompt(40)
    rid, _ = _complete(alice, prompt)
    _, mine = _complete(alice, prompt, prompt_cache_diagnostics={"compare_to": rid})
    assert (mine["compare_to_found"], mine["compared_with"]) == (True, rid)
    # (two salts, so that the second is not a hit of the first)
    _, theirs = _complete(bob, prompt, cache_salt="s1",
                          prompt_cache_diagnostics={"compare_to": rid})
    _, unknown = _complete(bob, prompt, cache_salt="s2",
                           prompt_cache_diagnostics={"compare_to": "cmpl-x"})
    assert theirs == unknown
    assert (theirs["compare_to_found"], theirs["reason"], theirs["divergence"]) == (
        False, "never_seen", None)
    # nor does a best match ever come from another tenant
    _, best = _complete(bob, prompt)
    assert best["compared_with"] is None or best["compared_with"] != rid


def test_bad_asks_are_400_naming_the_field(server):
    c = _client(server)
    for bad, param in (("yes", "prompt_cache_diagnostics"),
                       ({"compare_to": 5}, "prompt_cache_diagnostics.compare_to")):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="tiny", prompt="hello", max_tokens=1,
                                 extra_body={"prompt_cache_diagnostics": bad})
        assert e.value.body["param"] == param
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny", prompt="hello", max_tokens=1,
                             extra_headers={"X-Cache-Diagnostics": "maybe"})
    assert e.value.body["param"] == "x-cache-diagnostics"
    r = httpx.post(f"{server.base}/v1/messages", json={
        "model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}],
        "diagnostics": {"previous_message_id": 7}}, timeout=30)
    assert r.status_code == 400 and "diagnostics.previous_message_id" in r.text


def test_metrics_count_reasons_of_requests_that_asked(server):
    before = server.wait_idle()
    _client(server).completions.create(model="tiny", prompt=unique_prompt(40), max_tokens=2)
    idle = server.wait_idle()  # a request that does not ask: no diagnostic work
    assert idle["cache_diagnostics_requests_total"] == before[
        "cache_diagnostics_requests_total"]
    _complete(_client(server), unique_prompt(40))
    after = server.wait_idle()
    assert labelled(after, "cache_miss_reason_total", reason="never_seen") == labelled(
        before, "cache_miss_reason_total", reason="never_seen") + 1
    assert after["cache_diagnostics_requests_total"] >= 1


# -- a small pool, where evictions, quotas and pin expiry are cheap to construct -----------
SMALL_PAGES = 18  # a 16-page prompt cannot fit beside a pinned 4-page one


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """18 pages, ``--max-model-len 256``, the key file (bob: a quota of half the pool)."""
    keys = tmp_path_factory.mktemp("diag-keys") / "keys.json"
    keys.write_text(json.dumps(KEYS))
    srv = LiveServer(["--served-model-name", "tiny", "--num-pages", str(SMALL_PAGES),
                      "--max-model-len", "256", "--api-keys", str(keys)],
                     tmp_path_factory.mktemp("diag") / "server.log")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


def _ids(k: int, n: int) -> list[int]:
    return [(1000 * k + 7 * t) % 260 + 3 for t in range(n)]


def _raw(srv, key: str, ids: list[int], **extra) -> dict:
    r = httpx.post(srv.v1 + "/completions", headers={"authorization": f"Bearer {key}"},
                   json={"model": "tiny", "prompt": ids, "max_tokens": 2, "ignore_eos": True,
                         **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_evicted_expired_and_admission_on_a_small_pool(small):
    doc = _ids(1, 4 * BLOCK + 1)
    _raw(small, "sk-alice", doc, prompt_cache_diagnostics=True)
    for k in (2, 3):  # 16-page prompts: the document's pages go
        _raw(small, "sk-alice", _ids(k, 16 * BLOCK - 2))
    d = _raw(small, "sk-alice", doc, prompt_cache_diagnostics=True)["prompt_cache_diagnostics"]
    assert (d["reason"], d["detail"], d["cached_tokens"], d["reusable_tokens"]) == (
        "evicted", "pool", 0, 4 * BLOCK)

    pinned = _raw(small, "sk-alice", _ids(4, 4 * BLOCK + 1), cache_ttl=1,
                  prompt_cache_diagnostics=True)
    expires_at = pinned["pins"][0]["expires_at"]
    wait_until(lambda: time.time() > expires_at + 0.05, "the pin's expiry time to pass")
    _raw(small, "sk-alice", _ids(5, 16 * BLOCK - 2))  # needs the pinned pages: they lapse
    d = _raw(small, "sk-alice", _ids(4, 4 * BLOCK + 1),
             prompt_cache_diagnostics=True)["prompt_cache_diagnostics"]
    assert (d["reason"], d["detail"], d["cached_tokens"]) == ("expired", "pin", 0)

    bob_doc = _ids(6, 4 * BLOCK + 1)
    _raw(small, "sk-bob", bob_doc, prompt_cache_diagnostics=True)
    _raw(small, "sk-bob", _ids(7, 8 * BLOCK - 1))  # bob at his quota recycles his own pages
    d = _raw(small, "sk-bob", bob_doc, prompt_cache_diagnostics=True)["prompt_cache_diagnostics"]
    # the tail goes first: its first page is still cached, the second was recycled
    assert (d["reason"], d["detail"], d["cached_tokens"]) == (
        "admission", "tenant_quota", BLOCK)
