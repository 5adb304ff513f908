"""``/metrics``: counters agree with the usage fields the clients saw; gauges, histograms,
bounded labels."""
from __future__ import annotations

import asyncio

import httpx
import openai

from tests.server.live import labelled, unique_prompt

IGNORE_EOS = {"ignore_eos": True}


def _sequential_usages(server) -> list:
    """A mix of requests, one at a time: warm and cold, completions and chat,
    streamed and not, sync and async."""
    c = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    shared = unique_prompt(30)
    usages = []
    for prompt in (shared, shared, unique_prompt(10)):
        usages.append(c.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                                           extra_body=IGNORE_EOS).usage)
    msgs = [{"role": "user", "content": shared}]
    for _ in range(2):
        s = c.chat.completions.create(model="tiny", messages=msgs, max_tokens=3, stream=True,
                                      stream_options={"include_usage": True},
                                      extra_body=IGNORE_EOS)
        usages.append(list(s)[-1].usage)

    async def more():
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0) as ac:
            r = await ac.completions.create(model="tiny", prompt=shared + " and more", max_tokens=2,
                                            extra_body=IGNORE_EOS)
            s = await ac.completions.create(model="tiny", prompt=shared, max_tokens=2,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=IGNORE_EOS)
            return [r.usage, [ch async for ch in s][-1].usage]

    usages += asyncio.run(more())
    return usages


def test_counters_agree_with_usage(server):
    server.wait_idle()
    before = server.metrics()
    usages = _sequential_usages(server)
    after = server.wait_idle()

    def delta(name: str) -> float:
        return after[name] - before[name]

    prompt = sum(u.prompt_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    completion = sum(u.completion_tokens for u in usages)
    assert cached > 0
    assert delta("prefix_cache_queries_total") == prompt
    assert delta("prefix_cache_hits_total") == cached
    assert delta("prompt_tokens_total") == prompt
    assert delta("generation_tokens_total") == completion
    # one request at a time: the engine computed exactly the prompt tokens not cached
    assert delta("prefill_tokens_computed_total") == prompt - cached
    n = len(usages)
    assert delta('request_success_total{finished_reason="length"}') == n
    assert delta("time_to_first_token_seconds_count") == n
    assert delta("e2e_request_latency_seconds_count") == n
    assert delta("inter_token_latency_seconds_count") == completion - n
    assert delta("time_to_first_token_seconds_sum") > 0


def test_gauges_and_exposition(server):
    text = httpx.get(server.base + "/metrics", timeout=60).text
    for name, kind in [("prefix_cache_queries_total", "counter"),
                       ("prefix_cache_hits_total", "counter"),
                       ("prefix_cache_inflight_hits_total", "counter"),
                       ("prefix_cache_evictions_total", "counter"),
                       ("prefill_tokens_computed_total", "counter"),
                       ("kv_pages_free", "gauge"), ("kv_pages_cached", "gauge"),
                       ("kv_pages_live", "gauge"), ("requests_running", "gauge"),
                       ("requests_waiting", "gauge"),
                       ("time_to_first_token_seconds", "histogram"),
                       ("inter_token_latency_seconds", "histogram"),
                       ("e2e_request_latency_seconds", "histogram")]:
        assert f"# TYPE {name} {kind}" in text, name
    m = server.wait_idle()
    assert m["kv_pages_free"] + m["kv_pages_cached"] + m["kv_pages_live"] == m["kv_pages_total"]
    # single-tenant: no tenant label anywhere, and no label carries a request id
    assert "tenant=" not in text
    assert "cmpl-" not in text
    assert "_created" not in text  # no per-series creation timestamps


def test_tenant_labels_count_per_tenant(tenant_server):
    tenant_server.wait_idle()
    before = tenant_server.metrics()
    prompt = unique_prompt(30)
    usages = []
    for key in ("sk-alice", "sk-alice", "sk-bob"):
        c = openai.OpenAI(base_url=tenant_server.v1, api_key=key, max_retries=0)
        usages.append(c.completions.create(model="tiny", prompt=prompt, max_tokens=2,
                                           extra_body=IGNORE_EOS).usage)
    after = tenant_server.wait_idle()

    def delta(name, tenant):
        return labelled(after, name, tenant=tenant) - labelled(before, name, tenant=tenant)

    assert delta("prefix_cache_queries_total", "alice") == usages[0].prompt_tokens * 2
    hit = usages[1].prompt_tokens_details.cached_tokens
    assert delta("prefix_cache_hits_total", "alice") == hit > 0
    assert delta("prefix_cache_queries_total", "bob") == usages[2].prompt_tokens
    assert delta("prefix_cache_hits_total", "bob") == 0
    assert delta("prefix_cache_queries_total", "ops") == 0
