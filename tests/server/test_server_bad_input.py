"""Malformed requests: each gets a 4xx with an OpenAI error object naming the parameter;
after the whole table the server still serves correctly and every page is back."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server.live import unique_prompt

C, CH = "/v1/completions", "/v1/chat/completions"
OK_MSG = [{"role": "user", "content": "hi"}]
HUGE = 9 << 20  # over the 8 MiB default limit


def _chunked_huge():
    yield b'{"model": "tiny", "prompt": "'
    for _ in range(9):
        yield b"a" * (1 << 20)
    yield b'"}'


def cb(**kw) -> dict:
    """A completions body: valid except for ``kw``."""
    return {"model": "tiny", "prompt": "Hello", "max_tokens": 4, **kw}


def chb(**kw) -> dict:
    return {"model": "tiny", "messages": OK_MSG, "max_tokens": 4, **kw}


# (name, method, path, body: dict | bytes | callable | None, headers, status, param)
TABLE = [
    ("bad_json", "POST", C, b'{"model": "tiny", "prompt": ', {}, 400, None),
    ("not_an_object", "POST", C, b'[1, 2, 3]', {}, 400, None),
    ("empty_body", "POST", CH, b"", {}, 400, None),
    ("missing_prompt", "POST", C, {"model": "tiny", "max_tokens": 4}, {}, 400, "prompt"),
    ("missing_messages", "POST", CH, {"model": "tiny"}, {}, 400, "messages"),
    ("prompt_wrong_type", "POST", C, cb(prompt=42), {}, 400, "prompt"),
    ("prompt_mixed_list", "POST", C, cb(prompt=[1, "two"]), {}, 400, "prompt"),
    ("max_tokens_string", "POST", C, cb(max_tokens="ten"), {}, 400, "max_tokens"),
    ("max_tokens_float", "POST", C, cb(max_tokens=2.5), {}, 400, "max_tokens"),
    ("stream_not_bool", "POST", C, cb(stream="yes"), {}, 400, "stream"),
    ("temperature_string", "POST", CH, chb(temperature="hot"), {}, 400, "temperature"),
    ("n_string", "POST", C, cb(n="2"), {}, 400, "n"),
    ("message_bad_role", "POST", CH, chb(messages=[{"role": "wizard", "content": "x"}]), {},
     400, "messages[0].role"),
    ("message_missing_role", "POST", CH, chb(messages=[{"content": "x"}]), {}, 400,
     "messages[0].role"),
    ("messages_not_list", "POST", CH, chb(messages="hi"), {}, 400, "messages"),
    ("empty_prompt", "POST", C, cb(prompt=""), {}, 400, "prompt"),
    ("empty_prompt_ids", "POST", C, cb(prompt=[]), {}, 400, "prompt"),
    ("empty_prompt_in_array", "POST", C, cb(prompt=["ok", ""]), {}, 400, "prompt"),
    ("empty_messages", "POST", CH, chb(messages=[]), {}, 400, "messages"),
    ("prompt_too_long", "POST", C, cb(prompt="x" * 5000), {}, 400, "prompt"),
    ("prompt_ids_too_long", "POST", C, cb(prompt=[65] * 4096), {}, 400, "prompt"),
    ("chat_too_long", "POST", CH, chb(messages=[{"role": "user", "content": "y" * 5000}]), {},
     400, "messages"),
    ("cache_ttl_negative", "POST", C, cb(cache_ttl=-5), {}, 400, "cache_ttl"),
    ("cache_ttl_bad_unit", "POST", C, cb(cache_ttl="5 days"), {}, 400, "cache_ttl"),
    ("cache_control_type", "POST", C, cb(cache_control={"type": "forever"}), {}, 400,
     "cache_control"),
    ("cache_control_ttl", "POST", C, cb(cache_control={"type": "ephemeral", "ttl": "0m"}),
     {}, 400, "cache_control.ttl"),
    ("max_tokens_negative", "POST", C, cb(max_tokens=-5), {}, 400, "max_tokens"),
    ("max_tokens_too_large", "POST", C, cb(max_tokens=100_000), {}, 400, "max_tokens"),
    ("max_completion_tokens_zero", "POST", CH, chb(max_completion_tokens=0), {}, 400,
     "max_completion_tokens"),
    ("chat_max_tokens_too_large", "POST", CH, chb(max_tokens=5000), {}, 400, "max_tokens"),
    ("n_two", "POST", C, cb(n=2), {}, 400, "n"),
    ("n_zero_chat", "POST", CH, chb(n=0), {}, 400, "n"),
    ("best_of_three", "POST", C, cb(best_of=3), {}, 400, "best_of"),
    ("temperature_negative", "POST", C, cb(temperature=-0.5), {}, 400, "temperature"),
    ("top_p_zero", "POST", C, cb(top_p=0), {}, 400, "top_p"),
    ("top_p_above_one", "POST", CH, chb(top_p=1.5), {}, 400, "top_p"),
    ("top_p_negative", "POST", C, cb(top_p=-0.1), {}, 400, "top_p"),
    ("unknown_model", "POST", C, cb(model="gpt-4o"), {}, 404, "model"),
    ("unknown_model_chat", "POST", CH, chb(model="gpt-4o"), {}, 404, "model"),
    ("token_id_above_vocab", "POST", C, cb(prompt=[256, 72, 600]), {}, 400, "prompt"),
    ("token_id_negative", "POST", C, cb(prompt=[256, -1]), {}, 400, "prompt"),
    ("token_ids_batch_out_of_vocab", "POST", C, cb(prompt=[[72], [10**6]]), {}, 400, "prompt"),
    ("too_many_stop_strings", "POST", C, cb(stop=[f"s{i}" for i in range(17)]), {}, 400, "stop"),
    ("empty_stop_string", "POST", CH, chb(stop=["ok", ""]), {}, 400, "stop"),
    ("stop_wrong_type", "POST", C, cb(stop=7), {}, 400, "stop"),
    ("stop_token_id_out_of_vocab", "POST", C, cb(stop_token_ids=[9999]), {}, 400,
     "stop_token_ids"),
    ("oversized_body", "POST", C, b'{"prompt": "' + b"a" * HUGE + b'"}', {}, 413, None),
    ("oversized_chunked_body", "POST", C, _chunked_huge, {}, 413, None),
    ("logprobs_too_many", "POST", C, cb(logprobs=50), {}, 400, "logprobs"),
    ("top_logprobs_without_logprobs", "POST", CH, chb(top_logprobs=3), {}, 400, "top_logprobs"),
    ("logit_bias", "POST", C, cb(logit_bias={"50": 10}), {}, 400, "logit_bias"),
    ("stream_options_without_stream", "POST", C, cb(stream_options={"include_usage": True}),
     {}, 400, "stream_options"),
    ("stream_options_wrong_type", "POST", CH, chb(stream=True, stream_options={"include_usage": 3}),
     {}, 400, "stream_options.include_usage"),
    ("empty_cache_salt", "POST", C, cb(cache_salt=""), {}, 400, "cache_salt"),
    ("seed_too_large", "POST", C, cb(seed=2**70), {}, 400, "seed"),
    ("presence_penalty_out_of_range", "POST", C, cb(presence_penalty=5), {}, 400,
     "presence_penalty"),
    ("response_format_unknown_type", "POST", CH, chb(response_format={"type": "xml"}), {}, 400,
     "response_format.type"),
    ("image_content_part", "POST", CH,
     chb(messages=[{"role": "user", "content": [{"type": "image_url",
                                                  "image_url": {"url": "http://x/y.png"}}]}]),
     {}, 400, "messages[0].content[0]"),
    ("tool_choice_required", "POST", CH, chb(tool_choice="required"), {}, 400, "tool_choice"),
    ("too_many_prompts", "POST", C, cb(prompt=["a"] * 300), {}, 400, "prompt"),
    ("wrong_method", "GET", C, None, {}, 405, None),
    ("unknown_route", "POST", "/v1/embeddings", cb(), {}, 404, None),
]


@pytest.fixture(scope="module")
def table_client(server):
    server.wait_idle()
    with httpx.Client(base_url=server.base, timeout=60) as c:
        yield c


def test_table_is_big_enough():
    assert len(TABLE) >= 25
    assert len({row[0] for row in TABLE}) == len(TABLE)


@pytest.mark.parametrize("name,method,path,body,headers,status,param", TABLE,
                         ids=[row[0] for row in TABLE])
def test_bad_input(table_client, name, method, path, body, headers, status, param):
    kw: dict = {"headers": {"Content-Type": "application/json", **headers}}
    if callable(body):
        kw["content"] = body()
    elif isinstance(body, bytes):
        kw["content"] = body
    elif body is not None:
        kw["content"] = json.dumps(body).encode()
    r = table_client.request(method, path, **kw)
    assert r.status_code == status, r.text[:300]
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert err["param"] == param, err
    if status == 404 and param == "model":
        assert err["code"] == "model_not_found"


def test_server_still_serves_after_the_table(server, table_client):
    """Runs after the table (module order): correct answers, and no page is held."""
    c = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)
    prompt = unique_prompt()
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                             extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3 and r.usage.prompt_tokens_details.cached_tokens == 0
    r = c.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                             extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens_details.cached_tokens > 0
    m = server.wait_idle()
    assert m["kv_pages_live"] == 0
    assert m["kv_pages_free"] + m["kv_pages_cached"] == m["kv_pages_total"]
    assert m["requests_running"] == m["requests_waiting"] == 0
