"""A client that disconnects or cancels gets its request aborted and its pages freed;
``/reset_prefix_cache`` during a running stream does not disturb it."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.helpers.wait import DEADLINE_S, wait_until
from tests.server.live import LiveServer, labelled, unique_prompt

LONG = {"max_tokens": 2000, "ignore_eos": True}  # ~a minute of decoding if never aborted


def _aborts(m: dict) -> float:
    return labelled(m, "request_success_total", finished_reason="abort")


def _aborted(server: LiveServer, before: dict, n: int) -> dict[str, float]:
    """Wait until ``n`` more requests finished as aborted and the server is idle; that
    scrape (the count is checked exactly by the caller)."""
    wait_until(lambda: _aborts(server.metrics()) >= _aborts(before) + n, f"{n} aborts")
    return server.wait_idle()


async def _running(server: LiveServer, n: int) -> None:
    """Wait (off the event loop) until the server runs ``n`` requests."""
    await asyncio.to_thread(wait_until, lambda: server.metrics()["requests_running"] == n,
                            f"{n} requests running")


def test_httpx_disconnect_mid_stream_frees_pages(server):
    server.wait_idle()
    before = server.metrics()
    body = {"model": "tiny", "prompt": unique_prompt(60), "stream": True, **LONG}
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", server.v1 + "/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            for line in r.iter_lines():
                seen += line.startswith("data: ")
                if seen == 2:
                    assert server.metrics()["kv_pages_live"] > 0  # running
                if seen == 3:
                    break  # leaving iter_lines closes the connection
    after = _aborted(server, before, 1)
    assert _aborts(after) == _aborts(before) + 1
    assert after["kv_pages_free"] + after["kv_pages_cached"] == after["kv_pages_total"]


def test_openai_stream_close_frees_pages(server):
    server.wait_idle()
    before = server.metrics()
    c = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    stream = c.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": unique_prompt(60)}], stream=True,
        max_tokens=LONG["max_tokens"], extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    after = _aborted(server, before, 1)
    assert _aborts(after) == _aborts(before) + 1


def test_async_cancel_frees_pages(server):
    server.wait_idle()
    before = server.metrics()

    async def main():
        async with openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0) as c:
            streaming = [asyncio.Event() for _ in range(3)]

            async def consume(first_chunk: asyncio.Event):
                s = await c.completions.create(model="tiny", prompt=unique_prompt(60),
                                               stream=True, max_tokens=LONG["max_tokens"],
                                               extra_body={"ignore_eos": True})
                async for _ in s:
                    first_chunk.set()
            tasks = [asyncio.create_task(consume(e)) for e in streaming]
            # cancel once all three stream and the server runs them (a fixed pause can
            # end before they arrive on a loaded machine)
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), DEADLINE_S)
            await _running(server, 3)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())
    after = _aborted(server, before, 3)
    assert _aborts(after) == _aborts(before) + 3


def test_non_streaming_client_that_gives_up_frees_pages(server):
    """A client that stops waiting for a JSON answer (its timeout, a cancelled task):
    the server sees the connection close while the request runs and aborts it."""
    server.wait_idle()
    before = server.metrics()
    body = {"model": "tiny", "prompt": unique_prompt(60), **LONG}

    async def main():
        async with httpx.AsyncClient(timeout=DEADLINE_S) as c:
            task = asyncio.create_task(c.post(server.v1 + "/completions", json=body))
            await _running(server, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    after = _aborted(server, before, 1)
    assert _aborts(after) == _aborts(before) + 1


N_OUT = 400


def test_reset_during_stream_does_not_corrupt_it(server):
    """Reset while a stream runs, with another request allocating pages meanwhile: the
    stream's tokens and logprobs equal those of an identical run without reset."""
    c = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    prompt = unique_prompt(60)
    # long enough that the stream is almost always still running when its third chunk
    # arrives (the reset must find its pages in use)
    kw = dict(model="tiny", prompt=prompt, max_tokens=N_OUT, temperature=0, logprobs=0,
              stream=True, extra_body={"ignore_eos": True},
              stream_options={"include_usage": True})

    def run(reset: bool):
        tokens, lps, usage, report = [], [], None, None
        for i, ch in enumerate(c.completions.create(**kw)):
            if ch.usage is not None and not ch.choices:
                usage = ch.usage
                continue
            lp = ch.choices[0].logprobs
            tokens += lp.tokens
            lps += lp.token_logprobs
            if reset and i == 2:
                r = httpx.post(server.base + "/reset_prefix_cache", timeout=DEADLINE_S)
                assert r.status_code == 200
                report = r.json()
                # another request now takes free pages (any page the reset freed wrongly)
                c.completions.create(model="tiny", prompt=unique_prompt(200), max_tokens=1)
        return tokens, lps, usage, report

    run(False)                                   # cold: publishes the prompt's pages
    ref_tokens, ref_lps, ref_usage, _ = run(False)  # warm reference
    # the state the test needs is a reset that finds the stream running; a client
    # scheduled slowly enough can read its third chunk after the server has sent the
    # last one: then the prompt's pages are republished and the reset is tried again
    for _attempt in range(5):
        dropped_before = server.wait_idle()["prefix_cache_reset_dropped_pages_total"]
        tokens, lps, usage, report = run(True)
        if report["kept_in_use_pages"] > 0:       # the stream's pages were kept
            break
        run(False)
    assert report["kept_in_use_pages"] > 0, "no reset found the stream running"
    dropped = server.wait_idle()["prefix_cache_reset_dropped_pages_total"] - dropped_before
    assert report["dropped_pages"] == dropped    # the report is what the engine counted
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached == ref_usage.prompt_tokens_details.cached_tokens > 0
    assert usage.completion_tokens == N_OUT
    assert tokens == ref_tokens
    assert lps == pytest.approx(ref_lps, abs=1e-3)
    m = server.wait_idle()
    assert m["kv_pages_free"] + m["kv_pages_cached"] == m["kv_pages_total"]
