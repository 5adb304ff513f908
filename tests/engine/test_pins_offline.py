"""Pins and pre-stored prefixes through the offline API (builtin:tiny, CPU): exact
cached-token counts, pin cap, and nothing left behind after abort or a failed step."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.pins import PinCapError
from prefixcache.sampling_params import ParamError

BS = 16
GREEDY = SamplingParams(max_tokens=2, temperature=0.0)


def ids(k: int, n: int) -> dict:
    return {"prompt_token_ids": [(1000 * k + 7 * t) % 260 + 3 for t in range(n)]}


def make(num_pages: int = 24, **kw) -> LLM:
    return LLM("builtin:tiny", num_pages=num_pages, block_size=BS, max_model_len=256, **kw)


def test_max_tokens_zero_prefills_and_the_next_request_hits():
    llm = make()
    out = llm.generate(ids(0, 3 * BS + 5), SamplingParams(max_tokens=0))[0]
    comp = out.outputs[0]
    assert (comp.text, comp.token_ids, comp.finish_reason) == ("", [], "length")
    assert out.num_cached_tokens == 0 and "pin" not in out.extra
    s = llm.stats()
    assert s["published_pages"] == 3 and s["decode_tokens_computed"] == 0
    again = llm.generate({"prompt_token_ids": ids(0, 3 * BS + 5)["prompt_token_ids"] + [9]},
                         GREEDY)[0]
    assert again.num_cached_tokens == 3 * BS
    assert llm.stats()["pages_live"] == 0


def test_pin_prefix_survives_a_flood_and_lists_and_unpins_per_tenant():
    llm = make()
    pin = llm.pin_prefix(ids(0, 4 * BS), ttl_s=300, tenant="a")
    assert (pin["tokens"], pin["tier"], pin["cached_tokens"], pin["ttl_s"]) == (
        4 * BS, "pool", 0, 300)
    assert llm.list_pins("a") == [{k: v for k, v in pin.items() if k != "cached_tokens"}]
    assert llm.list_pins("b") == [] and llm.list_pins() == []
    for k in range(1, 12):  # 11 cold prompts of 4 pages: over twice the pool
        llm.generate(ids(k, 4 * BS - 1), GREEDY, tenant="a")
    assert llm.stats()["evictions"] > 20
    doc = ids(0, 4 * BS)["prompt_token_ids"] + [5, 6, 7]
    assert llm.generate({"prompt_token_ids": doc}, GREEDY, tenant="a")[0].num_cached_tokens \
        == 4 * BS
    # The other tenant neither hits nor sees nor removes it.
    assert llm.generate({"prompt_token_ids": doc}, GREEDY, tenant="b")[0].num_cached_tokens == 0
    assert llm.unpin(pin["prefix_hash"], tenant="b") is False
    assert llm.unpin(pin["prefix_hash"], tenant="a") is True
    assert llm.list_pins("a") == [] and llm.stats()["pins"] == 0
    with pytest.raises(ParamError, match="prefix_hash"):
        llm.unpin("not-hex", tenant="a")


def test_generate_with_pin_ttl_pins_the_full_prompt_pages():
    llm = make()
    out = llm.generate(ids(0, 2 * BS + 3), GREEDY, pin_ttl_s=60)[0]
    assert out.extra["pin"]["pinned"] and out.extra["pin"]["tokens"] == 2 * BS
    s = llm.stats()
    assert (s["pins"], s["pages_pinned"]) == (1, 2)


def test_the_pin_cap_refuses_and_bad_ttls_are_named():
    llm = make(num_pages=20, max_pinned_fraction=0.25)  # 5 pages
    llm.pin_prefix(ids(0, 4 * BS), ttl_s=60, tenant="a")
    with pytest.raises(PinCapError, match="pin cap"):
        llm.pin_prefix(ids(1, 2 * BS), ttl_s=60, tenant="b")
    with pytest.raises(ParamError) as e:
        llm.pin_prefix(ids(2, 2 * BS), ttl_s=-1)
    assert e.value.param == "ttl_s" and str(e.value).startswith("ttl_s: ")
    with pytest.raises(ParamError, match="prompt"):
        llm.pin_prefix(ids(3, BS - 1), ttl_s=5)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        make(enable_prefix_caching=False).pin_prefix(ids(0, 2 * BS), ttl_s=5)
    out = llm.generate(ids(4, 2 * BS), GREEDY, tenant="b", pin_ttl_s=60)[0]
    assert out.extra["pin"]["pinned"] is False and "pin cap" in out.extra["pin"]["error"]
    assert out.outputs[0].finish_reason == "length"  # refused pins never fail a request
    assert llm.stats()["pins"] == 1


def test_no_pin_and_no_page_left_after_abort_or_a_failed_step():
    llm = make()
    eng = llm.engine
    eng.add_request("r1", ids(0, 3 * BS)["prompt_token_ids"], GREEDY, pin_ttl_s=60)
    assert eng.abort_request("r1")
    eng.step()
    real = eng.model.forward

    def broken(batch, kv):
        raise RuntimeError("injected")

    eng.model.forward = broken
    eng.add_request("r2", ids(1, 3 * BS)["prompt_token_ids"], GREEDY, pin_ttl_s=60)
    outs = eng.step()
    assert outs[-1].outputs[0].finish_reason == "error"
    eng.model.forward = real
    s = llm.stats()
    assert (s["pins"], s["pages_pinned"], s["pages_live"], s["published_pages"]) == (0, 0, 0, 0)
    assert not eng.has_unfinished_requests()
