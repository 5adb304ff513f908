"""The OpenAI API through the official ``openai`` client: sync and async, streaming and
not, completions and chat; ``usage`` and ``cached_tokens``; batching; models and health."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.server.live import expected_hit, unique_prompt

IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0) as c:
        yield c


def _check_usage(usage, completion_tokens: int | None = None) -> None:
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    cached = usage.prompt_tokens_details.cached_tokens
    assert 0 <= cached <= usage.prompt_tokens - 1
    if completion_tokens is not None:
        assert usage.completion_tokens == completion_tokens


def test_health_and_models(server, client):
    assert httpx.get(server.base + "/health", timeout=60).json() == {"status": "ok"}
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert ids == ["tiny", "builtin:tiny"]
    raw = httpx.get(server.v1 + "/models", timeout=60).json()
    assert raw["data"][0]["max_model_len"] == 4096


def test_completion_cached_tokens_first_vs_repeat(client):
    prompt = unique_prompt()
    first = client.completions.create(model="tiny", prompt=prompt, max_tokens=4,
                                      temperature=0, extra_body=IGNORE_EOS)
    _check_usage(first.usage, 4)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert first.choices[0].finish_reason == "length"
    again = client.completions.create(model="builtin:tiny", prompt=prompt, max_tokens=4,
                                      temperature=0, extra_body=IGNORE_EOS)
    _check_usage(again.usage, 4)
    assert again.usage.prompt_tokens == first.usage.prompt_tokens
    assert (again.usage.prompt_tokens_details.cached_tokens
            == expected_hit(first.usage.prompt_tokens))
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_token_id_prompt_and_prompt_array(client):
    ids = [256] + list(unique_prompt().encode())
    one = client.completions.create(model="tiny", prompt=ids, max_tokens=3,
                                    extra_body=IGNORE_EOS)
    assert one.usage.prompt_tokens == len(ids)
    both = client.completions.create(model="tiny", prompt=[ids, ids[:40]], max_tokens=3,
                                     extra_body=IGNORE_EOS)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.prompt_tokens == len(ids) + 40
    assert both.usage.completion_tokens == 6
    # both prompts read the pages the first request published
    assert both.usage.prompt_tokens_details.cached_tokens == expected_hit(len(ids)) + 32


def test_streaming_usage_is_identical_in_every_chunk(client):
    prompt = unique_prompt()
    client.completions.create(model="tiny", prompt=prompt, max_tokens=2)  # warm
    stream = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=6, temperature=0, stream=True,
        extra_body=IGNORE_EOS,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    cached = {u.prompt_tokens_details.cached_tokens for u in usages}
    assert len(cached) == 1 and cached.pop() > 0
    final = chunks[-1]
    assert final.choices == []
    _check_usage(final.usage, 6)
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    # completion_tokens grows monotonically in continuous usage
    counts = [u.completion_tokens for u in usages]
    assert counts == sorted(counts)


def test_chat_continuous_usage_counts_tokens_sent(client):
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": unique_prompt(8)}], max_tokens=5,
        temperature=0, stream=True, extra_body=IGNORE_EOS,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks]
    assert chunks[0].choices[0].delta.role == "assistant" and counts[0] == 0
    token_chunks = counts[1:-1]  # then one chunk per delivery of new tokens
    assert token_chunks == sorted(set(token_chunks)) and token_chunks[0] >= 1
    assert token_chunks[-1] == counts[-1] == 5
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in chunks)


def test_stream_without_usage_has_no_usage_chunk(client):
    stream = client.completions.create(model="tiny", prompt=unique_prompt(), max_tokens=3,
                                       stream=True, extra_body=IGNORE_EOS)
    chunks = list(stream)
    assert all(c.usage is None for c in chunks)
    assert all(len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_non_streaming_and_streaming(client):
    messages = [{"role": "system", "content": unique_prompt(8)},
                {"role": "user", "content": "Tell me a story about a cat."}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5,
                                       temperature=0, extra_body=IGNORE_EOS)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    _check_usage(r.usage, 5)
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5,
                                            temperature=0, stream=True, extra_body=IGNORE_EOS,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    _check_usage(usage, 5)
    assert usage.prompt_tokens == r.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens == expected_hit(usage.prompt_tokens)
    assert all(c.usage is None for c in chunks[:-1])
    # greedy: the streamed text is the same as the non-streamed one
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == r.choices[0].message.content


def test_chat_logprobs(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": unique_prompt(4)}], max_tokens=3,
        logprobs=True, top_logprobs=2, extra_body=IGNORE_EOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_completion_logprobs_and_echo(client):
    prompt = unique_prompt(4)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=3, logprobs=2,
                                  extra_body=IGNORE_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    e = client.completions.create(model="tiny", prompt=prompt, max_tokens=2, echo=True,
                                  extra_body=IGNORE_EOS)
    assert e.choices[0].text.startswith(prompt)


def test_seeded_sampling_is_reproducible(client):
    prompt = unique_prompt()
    kw = dict(model="tiny", prompt=prompt, max_tokens=8, temperature=1.0, seed=1234,
              logprobs=0, extra_body=IGNORE_EOS)
    a = client.completions.create(**kw)   # cold
    b = client.completions.create(**kw)   # warm (reads the cache)
    assert b.usage.prompt_tokens_details.cached_tokens > 0
    assert a.choices[0].logprobs.tokens == b.choices[0].logprobs.tokens


def test_async_client_concurrent_requests_are_batched(server):
    before = server.metrics()
    n, max_tokens = 8, 12

    async def main():
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0) as c:
            async def one(i: int):
                if i % 2:
                    s = await c.completions.create(
                        model="tiny", prompt=unique_prompt(), max_tokens=max_tokens,
                        temperature=0, stream=True, stream_options={"include_usage": True},
                        extra_body=IGNORE_EOS)
                    return [ch async for ch in s][-1].usage
                r = await c.completions.create(model="tiny", prompt=unique_prompt(),
                                               max_tokens=max_tokens, temperature=0,
                                               extra_body=IGNORE_EOS)
                return r.usage
            return await asyncio.gather(*(one(i) for i in range(n)))

    usages = asyncio.run(main())
    for u in usages:
        _check_usage(u, max_tokens)
    after = server.wait_idle()
    steps = after["engine_steps_total"] - before["engine_steps_total"]
    tokens = sum(u.completion_tokens for u in usages)
    assert steps < tokens / 2, f"{steps} steps for {tokens} tokens: not batched"
    width_sum = (after["engine_step_batch_requests_sum"] - before["engine_step_batch_requests_sum"])
    width_n = (after["engine_step_batch_requests_count"]
               - before["engine_step_batch_requests_count"])
    assert width_sum / width_n > 2


def test_async_chat_streaming(server):
    async def main():
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0) as c:
            s = await c.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": unique_prompt(6)}],
                max_tokens=4, stream=True, stream_options={"include_usage": True},
                extra_body=IGNORE_EOS)
            return [ch async for ch in s]

    chunks = asyncio.run(main())
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-2].choices[0].finish_reason == "length"


def test_sse_wire_format(server):
    body = {"model": "tiny", "prompt": unique_prompt(4), "max_tokens": 2, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", server.v1 + "/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
