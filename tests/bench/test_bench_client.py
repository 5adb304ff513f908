"""The async client against a fake OpenAI streaming server (httpx.MockTransport)."""
from __future__ import annotations

import asyncio
import json

import httpx

from prefixcache.bench.client import ServingTarget, parse_prometheus, request_body, run_workload
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.workloads import BenchRequest


def sse(*chunks) -> bytes:
    events = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    return events + b"data: [DONE]\n\n"


def fake_server(seen: list):
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body, request.headers.get("authorization")))
        if body["prompt"] == "fail":
            return httpx.Response(400, json={"error": {"message": "bad prompt", "param": "prompt"}})
        n = body["max_tokens"]
        chunks = [{"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}]}
                  for i in range(n)]
        chunks[-1]["choices"][0]["finish_reason"] = "length"
        if body.get("stream_options", {}).get("include_usage"):
            chunks.append({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": n,
                                                   "prompt_tokens_details": {"cached_tokens": 32}}})
        return httpx.Response(200, content=sse(*chunks),
                              headers={"content-type": "text/event-stream"})
    return httpx.MockTransport(handler)


def test_workload_over_http_counts_tokens_and_follows_sessions():
    reqs = [BenchRequest(id="a0", session="a", turn=0, prompt="x", max_tokens=3, tenant="t1",
                         warm_expected=False),
            BenchRequest(id="a1", session="a", turn=1, prompt="x y", max_tokens=2, tenant="t1",
                         warm_expected=True),
            BenchRequest(id="bad", session="b", prompt="fail", max_tokens=2)]
    prompts = {"a0": Prompt("x", [1] * 40), "a1": Prompt("x y", [1] * 41),
               "bad": Prompt("fail", [2])}
    seen: list = []
    target = ServingTarget("http://peer", "bench",
                           headers=lambda r: {"Authorization": f"Bearer key-{r.tenant}"},
                           extra_body=lambda r: {"cache_salt": "s1"})
    done: list = []
    run = asyncio.run(run_workload(target, reqs, prompts, concurrency=4,
                                   transport=fake_server(seen), on_done=done.append))
    by_id = {r.id: r for r in run.results}
    assert len(done) == 3
    a0 = by_id["a0"]
    assert (a0.prompt_tokens, a0.cached_tokens, a0.output_tokens, a0.error) == (40, 32, 3, None)
    assert a0.send_time <= a0.first_token_time <= a0.end_time
    assert by_id["a1"].send_time >= a0.end_time  # same session: sent after a0 finished
    assert by_id["bad"].error.startswith("HTTP 400") and by_id["bad"].cached_tokens is None
    path, body, auth = next(x for x in seen if x[1]["prompt"] == "x")
    assert path == "/v1/completions" and auth == "Bearer key-t1"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.0 and body["max_tokens"] == 3 and body["cache_salt"] == "s1"


def test_server_without_usage_falls_back_to_counting():
    def handler(request):
        chunks = [{"choices": [{"text": "a", "finish_reason": None}]},
                  {"choices": [{"text": "b", "finish_reason": "length"}]}]
        return httpx.Response(200, content=sse(*chunks))
    reqs = [BenchRequest(id="r", session="r", prompt="p", max_tokens=2)]
    run = asyncio.run(run_workload(ServingTarget("http://x", "m"), reqs,
                                   {"r": Prompt("p", [5, 6, 7])},
                                   concurrency=1, transport=httpx.MockTransport(handler)))
    r = run.results[0]
    assert (r.prompt_tokens, r.output_tokens, r.cached_tokens, r.error) == (3, 2, None, None)


def test_request_body_chat_and_token_ids():
    chat = BenchRequest(id="c", session="c", messages=[{"role": "user", "content": "hi"}],
                        tools=[{"type": "function", "function": {"name": "f"}}], max_tokens=4)
    path, body = request_body(ServingTarget("u", "m", api="chat"), chat, Prompt("<rendered>", [1]))
    assert path == "/v1/chat/completions"
    assert body["messages"] == chat.messages and body["tools"] == chat.tools
    path, body = request_body(ServingTarget("u", "m"), chat, Prompt("<rendered>", [1]))
    assert path == "/v1/completions" and body["prompt"] == "<rendered>"
    _, body = request_body(ServingTarget("u", "m"), chat, Prompt(None, [7, 8]))
    assert body["prompt"] == [7, 8]


def test_parse_prometheus_sums_label_sets():
    text = """# HELP x
# TYPE prefill_tokens_computed_total counter
prefill_tokens_computed_total 1234.0
vllm:prefix_cache_hits_total{engine="0",model_name="bench"} 96.0
vllm:prefix_cache_hits_total{engine="1",model_name="bench"} 4.0
# TYPE ttft_seconds histogram
ttft_seconds_bucket{le="1.0"} 3
ttft_seconds_bucket{le="+Inf"} 5
ttft_seconds_sum 6.5
ttft_seconds_count 5
"""
    assert parse_prometheus(text) == {"prefill_tokens_computed_total": 1234.0,
                                      "vllm:prefix_cache_hits_total": 100.0,
                                      "ttft_seconds_bucket": 8.0, "ttft_seconds_sum": 6.5,
                                      "ttft_seconds_count": 5.0}
    assert parse_prometheus(None) == {}
    # not exposition format: no counters rather than half of them
    assert parse_prometheus(text + "garbage line\n") == {}
