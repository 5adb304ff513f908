"""``n`` and ``best_of`` through the official ``openai`` client: one prefill per prompt
(counted in /metrics), choices indexed ``prompt * n + sample``, streamed chunks carrying
their choice index, usage counting the prompt once and every sample's tokens."""
from __future__ import annotations

import openai
import pytest

from tests.server.live import BLOCK, expected_hit, unique_prompt

IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0) as c:
        yield c


def _delta(server, before: dict, name: str) -> float:
    after = server.wait_idle()
    return after[name] - before[name]


def test_completions_n8_costs_one_prefill(server, client):
    before = server.wait_idle()
    out = client.completions.create(model="tiny", prompt=unique_prompt(), n=8, max_tokens=5,
                                    seed=3, extra_body=IGNORE_EOS)
    after = server.wait_idle()
    p = out.usage.prompt_tokens
    assert sorted(c.index for c in out.choices) == list(range(8))
    assert all(c.finish_reason == "length" for c in out.choices)
    assert out.usage.completion_tokens == 8 * 5
    assert out.usage.total_tokens == p + 8 * 5
    assert out.usage.prompt_tokens_details.cached_tokens == 0
    assert after["prefill_tokens_computed_total"] - before["prefill_tokens_computed_total"] == p
    assert (after["prefix_cache_queries_total"] - before["prefix_cache_queries_total"]) == p
    shared = after["kv_fork_shared_pages_total"] - before["kv_fork_shared_pages_total"]
    copied = after["kv_fork_copied_pages_total"] - before["kv_fork_copied_pages_total"]
    assert shared == 7 * (p // BLOCK)
    assert copied == (7 if p % BLOCK else 0)
    assert (after["generation_tokens_total"] - before["generation_tokens_total"]) == 40
    assert len({c.text for c in out.choices}) > 1  # seeded samples differ


def test_two_prompts_with_n2_index_prompt_times_n_plus_sample(server, client):
    a, b = unique_prompt(), unique_prompt(30)
    out = client.completions.create(model="tiny", prompt=[a, b], n=2, max_tokens=3,
                                    temperature=0, extra_body=IGNORE_EOS)
    by_index = {c.index: c.text for c in out.choices}
    assert sorted(by_index) == [0, 1, 2, 3]
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy
    one = client.completions.create(model="tiny", prompt=b, max_tokens=3, temperature=0,
                                    extra_body=IGNORE_EOS)
    assert one.choices[0].text == by_index[2]
    pa = client.completions.create(model="tiny", prompt=a, max_tokens=0).usage.prompt_tokens
    assert out.usage.prompt_tokens == pa + one.usage.prompt_tokens
    assert out.usage.completion_tokens == 4 * 3
    server.wait_idle()


def test_chat_n3_seeded_is_reproducible_and_cached_once(server, client):
    msgs = [{"role": "user", "content": unique_prompt()}]
    first = client.chat.completions.create(model="tiny", messages=msgs, n=3, seed=7,
                                           max_tokens=6, extra_body=IGNORE_EOS)
    again = client.chat.completions.create(model="tiny", messages=msgs, n=3, seed=7,
                                           max_tokens=6, extra_body=IGNORE_EOS)
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.message.content for c in sorted(again.choices, key=lambda c: c.index)] == texts
    p = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == expected_hit(p)
    assert again.usage.prompt_tokens == p and again.usage.completion_tokens == 3 * 6
    server.wait_idle()


def test_chat_stream_n2_chunks_carry_the_choice_index(server, client):
    msgs = [{"role": "user", "content": unique_prompt()}]
    whole = client.chat.completions.create(model="tiny", messages=msgs, n=2, seed=5,
                                           max_tokens=6, extra_body=IGNORE_EOS)
    stream = client.chat.completions.create(model="tiny", messages=msgs, n=2, seed=5,
                                            max_tokens=6, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body=IGNORE_EOS)
    text = {0: "", 1: ""}
    roles, finishes, usage = {0: 0, 1: 0}, {0: [], 1: []}, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role is not None:
                roles[ch.index] += 1
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason is not None:
                finishes[ch.index].append(ch.finish_reason)
    want = {c.index: c.message.content for c in whole.choices}
    assert text == want
    assert roles == {0: 1, 1: 1}
    assert finishes == {0: ["length"], 1: ["length"]}
    assert usage.completion_tokens == 2 * 6
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    server.wait_idle()


def test_best_of_returns_the_most_likely_samples(server, client):
    prompt = unique_prompt()
    every = client.completions.create(model="tiny", prompt=prompt, n=4, seed=9, max_tokens=5,
                                      logprobs=0, extra_body=IGNORE_EOS)
    best = client.completions.create(model="tiny", prompt=prompt, n=2, best_of=4, seed=9,
                                     max_tokens=5, extra_body=IGNORE_EOS)

    def total(c):
        return sum(c.logprobs.token_logprobs)

    ranked = sorted(every.choices, key=total, reverse=True)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1]
    assert all(c.logprobs is None for c in best.choices)
    assert best.usage.completion_tokens == 2 * 5  # the returned samples, as OpenAI counts
    server.wait_idle()


def test_stream_closed_early_aborts_every_sample(server, client):
    before = server.wait_idle()
    stream = client.completions.create(model="tiny", prompt=unique_prompt(), n=4,
                                       max_tokens=2000, stream=True, extra_body=IGNORE_EOS)
    first = next(iter(stream))
    assert first.choices[0].index in range(4)
    stream.close()
    after = server.wait_idle(timeout=60)  # every page back: all four samples aborted
    key = 'request_success_total{finished_reason="abort"}'
    assert after.get(key, 0) - before.get(key, 0) == 1
