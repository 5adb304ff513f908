"""Tenant isolation from API keys, ``cache_salt``, authentication, admin reset, and the
429 of a full queue."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server.live import expected_hit, labelled, unique_prompt

IGNORE_EOS = {"ignore_eos": True}


def _client(srv, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.v1, api_key=key, max_retries=0)


def _cached(client: openai.OpenAI, prompt: str, **extra) -> tuple[int, int]:
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=2,
                                  extra_body={**IGNORE_EOS, **extra})
    return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def test_tenants_never_share_pages(tenant_server):
    alice, alice2, bob = (_client(tenant_server, k) for k in ("sk-alice", "sk-alice-2", "sk-bob"))
    prompt = unique_prompt(40)
    assert _cached(alice, prompt)[0] == 0
    # B's first request with the same long prompt gets nothing from A's pages ...
    assert _cached(bob, prompt)[0] == 0
    # ... even when it claims A's tenant in the body: the tenant comes from the key only
    assert _cached(bob, unique_prompt(40), tenant="alice")[0] == 0
    # A's repeat hits, and so does another key of the same tenant
    cached, n = _cached(alice, prompt)
    assert cached == expected_hit(n) > 0
    assert _cached(alice2, prompt)[0] == expected_hit(n)
    # B's repeat hits B's own pages
    assert _cached(bob, prompt)[0] == expected_hit(n)


def test_cache_salt_is_a_sub_namespace(tenant_server):
    alice = _client(tenant_server, "sk-alice")
    prompt = unique_prompt(40)
    _, n = _cached(alice, prompt)
    assert _cached(alice, prompt, cache_salt="s1")[0] == 0
    assert _cached(alice, prompt, cache_salt="s1")[0] == expected_hit(n)
    assert _cached(alice, prompt, cache_salt="s2")[0] == 0
    assert _cached(alice, prompt)[0] == expected_hit(n)


def test_cache_salt_single_tenant(server):
    c = openai.OpenAI(base_url=server.v1, api_key="anything", max_retries=0)
    prompt = unique_prompt(40)
    _, n = _cached(c, prompt)
    assert _cached(c, prompt)[0] == expected_hit(n)
    assert _cached(c, prompt, cache_salt="team-1")[0] == 0
    assert _cached(c, prompt, cache_salt="team-1")[0] == expected_hit(n)


@pytest.mark.parametrize("headers", [
    {}, {"Authorization": "Bearer sk-nope"}, {"Authorization": "sk-alice"},
    {"Authorization": "Basic sk-alice"}, {"Authorization": "Bearer"},
])
def test_missing_or_unknown_key_is_401(tenant_server, headers):
    for method, path, body in [("POST", "/v1/completions", {"model": "tiny", "prompt": "x"}),
                               ("POST", "/v1/chat/completions", {"model": "tiny", "messages": []}),
                               ("GET", "/v1/models", None),
                               ("POST", "/reset_prefix_cache", None)]:
        r = httpx.request(method, tenant_server.base + path, json=body, headers=headers, timeout=60)
        assert r.status_code == 401, (path, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"


def test_openai_client_with_bad_key(tenant_server):
    with pytest.raises(openai.AuthenticationError):
        _client(tenant_server, "sk-wrong").models.list()
    assert [m.id for m in _client(tenant_server, "sk-bob").models.list().data] == ["tiny"]


def test_health_and_metrics_need_no_key(tenant_server):
    assert httpx.get(tenant_server.base + "/health", timeout=60).status_code == 200
    m = tenant_server.metrics()
    # the tenant label exists exactly for the configured tenants
    for t in ("alice", "bob", "ops"):
        labelled(m, "prefix_cache_queries_total", tenant=t)
    assert not any('tenant=""' in k for k in m)


def test_reset_is_admin_only_and_reports_honestly(tenant_server):
    r = httpx.post(tenant_server.base + "/reset_prefix_cache",
                   headers={"Authorization": "Bearer sk-alice"}, timeout=60)
    assert r.status_code == 403
    assert r.json()["error"]["type"] == "permission_error"
    alice = _client(tenant_server, "sk-alice")
    prompt = unique_prompt(40)
    _, n = _cached(alice, prompt)
    tenant_server.wait_idle()
    before = tenant_server.metrics()
    r = httpx.post(tenant_server.base + "/reset_prefix_cache",
                   headers={"Authorization": "Bearer sk-ops"}, timeout=60)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["dropped_pages"] == before["kv_pages_cached"] > 0
    assert report["kept_in_use_pages"] == 0
    after = tenant_server.metrics()
    assert after["kv_pages_cached"] == 0
    assert after["kv_pages_free"] == after["kv_pages_total"]
    assert _cached(alice, prompt)[0] == 0  # really dropped


def test_full_queue_answers_429_with_retry_after(tenant_server):
    """``--max-num-seqs 2 --max-waiting-requests 2``: of 10 simultaneous long
    requests, some must be refused at once, none may hang."""
    body = {"model": "tiny", "max_tokens": 48, "ignore_eos": True}

    async def main():
        async with httpx.AsyncClient(timeout=60,
                                     headers={"Authorization": "Bearer sk-bob"}) as c:
            return await asyncio.gather(*(
                c.post(tenant_server.v1 + "/completions", json={**body, "prompt": unique_prompt()})
                for _ in range(10)))

    responses = asyncio.run(main())
    codes = sorted(r.status_code for r in responses)
    assert 429 in codes and 200 in codes, codes
    assert set(codes) <= {200, 429}
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["error"]["type"] == "rate_limit_error"
        else:
            assert r.json()["usage"]["completion_tokens"] == 48
    tenant_server.wait_idle()
    m = tenant_server.metrics()
    assert labelled(m, "requests_rejected_total", code="429") >= 1


def test_openai_client_sees_rate_limit(tenant_server):
    async def main():
        async with openai.AsyncOpenAI(base_url=tenant_server.v1, api_key="sk-alice",
                                      max_retries=0) as c:
            return await asyncio.gather(*(
                c.completions.create(model="tiny", prompt=unique_prompt(), max_tokens=48,
                                     extra_body=IGNORE_EOS)
                for _ in range(10)), return_exceptions=True)

    results = asyncio.run(main())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors and all(isinstance(e, openai.RateLimitError) for e in errors)
    assert any(not isinstance(r, BaseException) for r in results)
    tenant_server.wait_idle()
