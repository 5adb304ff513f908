"""The offline ``LLM``'s argument checks (builtin:tiny, CPU): chat messages with the
server's rules, a closed LLM refusing work, bounded pin TTLs, typed sampling fields and
namespaces, and the pin cap's message when pinning is disabled."""
from __future__ import annotations

import math

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.pins import MAX_PIN_TTL_S, PinCapError
from prefixcache.sampling_params import ParamError

BS = 16
PROMPT = {"prompt_token_ids": [(7 * t) % 250 + 3 for t in range(2 * BS)]}
ONE = SamplingParams(max_tokens=1, temperature=0.0)


def make(**kw) -> LLM:
    return LLM("builtin:tiny", num_pages=24, block_size=BS, max_model_len=256, **kw)


@pytest.fixture(scope="module")
def llm():
    with make() as m:
        yield m


@pytest.mark.parametrize("messages, param", [
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "ok"}, {"role": "user", "content": 5}],
     "messages[1].content"),
    ([{"role": "user", "content": [{"type": "image"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": "x", "name": 3}], "messages[0].name"),
    (["hello"], "messages[0]"),
    ([], "messages"),
    ([[{"role": "user", "content": "x"}], [{"role": "bot", "content": "x"}]],
     "messages[1][0].role"),
])
def test_chat_checks_messages_like_the_server(llm, messages, param):
    before = llm.stats()["prefill_tokens_computed"]
    with pytest.raises(ParamError) as e:
        llm.chat(messages, ONE)
    assert e.value.param == param and str(e.value).startswith(param + ": ")
    assert llm.stats()["prefill_tokens_computed"] == before  # nothing ran


def test_chat_accepts_text_parts_and_every_role(llm):
    out = llm.chat([{"role": "system", "content": "s"},
                    {"role": "user", "content": [{"type": "text", "text": "hi"}]}], ONE)
    assert len(out) == 1 and "<|user|>hi" in out[0].prompt


def test_a_closed_llm_refuses_work_and_close_is_idempotent():
    with make() as m:
        assert len(m.generate(PROMPT, ONE)) == 1
    for call in (lambda: m.generate(PROMPT, ONE),
                 lambda: m.chat([{"role": "user", "content": "x"}], ONE),
                 lambda: m.pin_prefix(PROMPT, ttl_s=60)):
        with pytest.raises(RuntimeError, match="this LLM is closed"):
            call()
    m.close()  # again: no error
    assert m.stats()["pages_total"] == 24


@pytest.mark.parametrize("ttl", [True, False, 0, 0.5, -1, MAX_PIN_TTL_S + 1, 10**12, 1e300,
                                 math.inf, math.nan, "60"])
def test_pin_ttls_are_bounded_like_http(llm, ttl):
    with pytest.raises(ParamError) as e:
        llm.pin_prefix(PROMPT, ttl_s=ttl)
    assert e.value.param == "ttl_s" and "from 1 to 604800" in str(e.value)
    with pytest.raises(ParamError) as e:
        llm.generate(PROMPT, ONE, pin_ttl_s=ttl)
    assert e.value.param == "pin_ttl_s"
    assert llm.list_pins() == []


def test_pin_ttl_bounds_are_inclusive(llm):
    assert llm.pin_prefix(PROMPT, ttl_s=MAX_PIN_TTL_S)["ttl_s"] == MAX_PIN_TTL_S
    out = llm.generate(PROMPT, ONE, pin_ttl_s=1)[0]
    assert out.extra["pin"]["pinned"] is True
    for p in llm.list_pins():
        assert llm.unpin(p["prefix_hash"]) is True


@pytest.mark.parametrize("field", ["n", "top_k", "min_tokens", "seed", "max_tokens",
                                   "logprobs", "prompt_logprobs"])
@pytest.mark.parametrize("bad", ["5", 1.5, True])
def test_integer_sampling_fields_name_themselves(field, bad):
    with pytest.raises(ParamError) as e:
        SamplingParams(**{field: bad})
    assert e.value.param == field and "must be an integer" in str(e.value)


@pytest.mark.parametrize("field", ["temperature", "top_p", "min_p", "presence_penalty",
                                   "frequency_penalty", "repetition_penalty"])
@pytest.mark.parametrize("bad", ["0.5", True, None, math.nan])
def test_float_sampling_fields_name_themselves(field, bad):
    with pytest.raises(ParamError) as e:
        SamplingParams(**{field: bad})
    assert e.value.param == field and "must be a finite number" in str(e.value)


@pytest.mark.parametrize("name, bad", [("tenant", 5), ("tenant", 3.5), ("cache_salt", 1),
                                       ("cache_salt", b"x")])
def test_tenant_and_cache_salt_must_be_strings(llm, name, bad):
    for call in (lambda: llm.generate(PROMPT, ONE, **{name: bad}),
                 lambda: llm.chat([{"role": "user", "content": "x"}], ONE, **{name: bad}),
                 lambda: llm.pin_prefix(PROMPT, ttl_s=60, **{name: bad})):
        with pytest.raises(ParamError) as e:
            call()
        assert e.value.param == name
    if name == "tenant":
        for call in (lambda: llm.list_pins(tenant=bad), lambda: llm.unpin("ab", tenant=bad)):
            with pytest.raises(ParamError) as e:
                call()
            assert e.value.param == "tenant"


@pytest.mark.parametrize("bad", ["", " ", "  ", "abc", "zz", "ab cd", "0x12", "ab\n"])
def test_unpin_rejects_blank_and_non_hex_hashes(llm, bad):
    with pytest.raises(ParamError) as e:
        llm.unpin(bad)
    assert e.value.param == "prefix_hash"
    assert llm.unpin("ab") is False


def test_pin_cap_error_says_pinning_is_disabled():
    with make(max_pinned_fraction=0) as m:
        with pytest.raises(PinCapError) as e:
            m.pin_prefix(PROMPT, ttl_s=60)
    msg = str(e.value)
    assert "pinning is disabled" in msg and "max_pinned_fraction=0" in msg
    assert "unpin something" not in msg
