"""Agent sessions on the HTTP APIs (live builtin:tiny server with API keys): a session is
named by ``session_id``, ``prompt_cache_key`` or ``X-Session-Id`` on the three APIs, is
its tenant's only, shows and closes through ``/v1/sessions/{id}``, and bad ids are 400s
naming the field."""
from __future__ import annotations

import uuid

import httpx
import openai

from tests.server.live import unique_prompt


def _client(srv, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.v1, api_key=key, max_retries=0)


def _session(srv, sid: str, key: str) -> httpx.Response:
    return httpx.get(f"{srv.base}/v1/sessions/{sid}",
                     headers={"authorization": f"Bearer {key}"}, timeout=60)


def _close(srv, sid: str, key: str) -> httpx.Response:
    return httpx.delete(f"{srv.base}/v1/sessions/{sid}",
                        headers={"authorization": f"Bearer {key}"}, timeout=60)


def test_session_named_three_ways_shown_and_closed_per_tenant(tenant_server):
    srv, alice = tenant_server, _client(tenant_server, "sk-alice")
    before = srv.metrics()
    sids = [f"job-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    r = alice.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": unique_prompt(20)}],
        max_tokens=3, extra_body={"session_id": sids[0], "ignore_eos": True})
    alice.completions.create(model="tiny", prompt=unique_prompt(20), max_tokens=3,
                             extra_body={"prompt_cache_key": sids[1], "ignore_eos": True})
    m = httpx.post(f"{srv.base}/v1/messages", json={
        "model": "tiny", "max_tokens": 3, "messages": [
            {"role": "user", "content": unique_prompt(20)}]},
        headers={"authorization": "Bearer sk-alice", "x-session-id": sids[2]}, timeout=60)
    assert m.status_code == 200, m.text
    kept = []
    for sid in sids:
        info = _session(srv, sid, "sk-alice").json()
        assert (info["object"], info["session_id"], info["running"], info["calls"]) == (
            "session", sid, 0, 1)
        assert info["tokens"] > 0 and info["tokens"] % 16 == 0 and info["expires_at"] > 0
        kept.append(info["tokens"])
    assert r.usage.prompt_tokens + 3 - 1 >= kept[0]
    # Same id, other tenant: another session, so nothing to see or close.
    assert _session(srv, sids[0], "sk-bob").status_code == 404
    bob_close = _close(srv, sids[0], "sk-bob")
    assert bob_close.status_code == 404 and bob_close.json()["error"]["code"] == \
        "session_not_found"
    mid = srv.metrics()
    assert mid["kv_sessions_live"] - before["kv_sessions_live"] == 3
    assert mid["kv_session_pages_held"] - before["kv_session_pages_held"] == sum(kept) // 16
    assert mid["kv_session_calls_total"] - before["kv_session_calls_total"] == 3
    for sid in sids:
        d = _close(srv, sid, "sk-alice")
        assert d.status_code == 200 and d.json() == {
            "object": "session.deleted", "session_id": sid, "deleted": True}
        assert _session(srv, sid, "sk-alice").status_code == 404
    after = srv.metrics()
    assert after["kv_sessions_live"] == before["kv_sessions_live"]
    assert after["kv_session_pages_held"] == before["kv_session_pages_held"]
    assert after["kv_sessions_closed_total"] - before["kv_sessions_closed_total"] == 3


def test_the_next_call_reads_the_kept_transcript(tenant_server):
    srv, alice = tenant_server, _client(tenant_server, "sk-alice")
    sid = f"job-{uuid.uuid4().hex[:8]}"
    msgs = [{"role": "user", "content": unique_prompt(30)}]
    r1 = alice.chat.completions.create(model="tiny", messages=msgs, max_tokens=20,
                                       extra_body={"session_id": sid, "ignore_eos": True})
    before = srv.metrics()
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "tool output: ok"}]
    r2 = alice.chat.completions.create(model="tiny", messages=msgs, max_tokens=2,
                                       extra_body={"session_id": sid})
    cached = r2.usage.prompt_tokens_details.cached_tokens
    kept = _session(srv, sid, "sk-alice").json()
    after = srv.metrics()
    assert cached >= r1.usage.prompt_tokens // 16 * 16 and cached % 16 == 0
    assert after["kv_session_hits_total"] - before["kv_session_hits_total"] == 1
    assert after["kv_session_hit_tokens_total"] - before["kv_session_hit_tokens_total"] \
        == cached
    assert kept["calls"] == 2 and kept["tokens"] >= cached
    assert _close(srv, sid, "sk-alice").status_code == 200


def test_bad_session_ids_are_400_naming_the_field(tenant_server):
    srv = tenant_server
    auth = {"authorization": "Bearer sk-alice"}
    for body, param in (({"session_id": ""}, "session_id"),
                        ({"prompt_cache_key": "k" * 257}, "prompt_cache_key"),
                        ({"session_id": 5}, "session_id")):
        r = httpx.post(f"{srv.base}/v1/chat/completions", headers=auth, timeout=60, json={
            "model": "tiny", "max_tokens": 1,
            "messages": [{"role": "user", "content": "hi"}], **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(f"{srv.base}/v1/completions", headers=auth, timeout=60, json={
        "model": "tiny", "max_tokens": 1, "prompt": ["a b", "c d"], "session_id": "s"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "session_id", r.text
    r = httpx.post(f"{srv.base}/v1/messages", timeout=60, json={
        "model": "tiny", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": "Bearer sk-alice", "x-session-id": "x" * 300})
    assert r.status_code == 400 and "x-session-id" in r.text, r.text
    assert _close(srv, "x" * 300, "sk-alice").status_code == 400
