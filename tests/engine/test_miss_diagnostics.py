"""Cache-miss diagnostics on the offline API (builtin:tiny, CPU): every reason code is
constructed and the reported one checked, with exact token counts; another tenant's
response is "not found" exactly like an unknown id; off means no diagnostic work."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.engine.miss_diagnostics import DiagnosticsRequest
from prefixcache.sampling_params import ParamError

BS = 16
GREEDY = SamplingParams(max_tokens=2, temperature=0.0)
ON = {"cache_diagnostics": True}


def ids(k: int, n: int) -> list[int]:
    return [(1000 * k + 7 * t) % 260 + 3 for t in range(n)]


def p(tokens: list[int]) -> dict:
    return {"prompt_token_ids": tokens}


def make(num_pages: int = 24, **kw) -> LLM:
    return LLM("builtin:tiny", num_pages=num_pages, block_size=BS, max_model_len=256, **kw)


def diag(llm: LLM, tokens: list[int], **kw) -> dict:
    kw.setdefault("cache_diagnostics", True)
    return llm.generate(p(tokens), kw.pop("params", GREEDY), **kw)[0].extra["cache_diagnostics"]


def test_off_does_no_diagnostic_work():
    llm = make()
    for _ in range(2):
        out = llm.generate(p(ids(0, 3 * BS)), GREEDY)[0]
        assert "cache_diagnostics" not in out.extra
    s = llm.stats()
    assert (s["diag_requests"], s["diag_responses_recorded"]) == (0, 0)
    assert all(s[f"miss_reason_{r}"] == 0 for r in ("none", "never_seen", "prefix_changed"))


def test_never_seen_then_none_then_prefix_changed_with_position():
    llm = make()
    base = ids(0, 4 * BS + 3)
    d = diag(llm, base)
    assert (d["reason"], d["prompt_tokens"], d["cached_tokens"]) == ("never_seen", 4 * BS + 3, 0)
    assert d["compared_with"] is None and d["divergence"] is None
    d = diag(llm, base)
    assert (d["reason"], d["cached_tokens"], d["reusable_tokens"]) == ("none", 4 * BS, 4 * BS)
    changed = base[:2 * BS + 5] + [2] + base[2 * BS + 6:]
    d = diag(llm, changed)
    assert (d["reason"], d["cached_tokens"], d["reusable_tokens"]) == (
        "prefix_changed", 2 * BS, 2 * BS)
    assert d["divergence"]["token"] == 2 * BS + 5
    assert d["compared_with"].startswith("offline-")
    s = llm.stats()
    assert (s["diag_requests"], s["miss_reason_prefix_changed"], s["miss_reason_none"]) == (3, 1, 1)


def test_compare_to_names_an_earlier_request_and_other_tenants_are_not_found():
    llm = make()
    first = llm.generate(p(ids(1, 3 * BS)), GREEDY, tenant="a", **ON)[0]
    rid = first.request_id
    d = diag(llm, ids(1, 3 * BS), tenant="a", cache_diagnostics={"compare_to": rid})
    assert (d["compared_with"], d["compare_to_found"], d["reason"]) == (rid, True, "none")
    theirs = diag(llm, ids(1, 3 * BS), tenant="b", cache_diagnostics={"compare_to": rid})
    unknown = diag(llm, ids(1, 3 * BS), tenant="c",
                   cache_diagnostics={"compare_to": "offline-999"})
    assert theirs == unknown
    assert (theirs["compare_to_found"], theirs["compared_with"], theirs["reason"]) == (
        False, None, "never_seen")
    assert theirs["divergence"] is None and theirs["reusable_tokens"] is None


def test_evicted_from_the_pool_and_reset():
    llm = make(num_pages=12)
    doc = ids(2, 4 * BS + 1)
    diag(llm, doc)
    for k in range(3, 8):  # cold prompts push the document's pages out
        llm.generate(p(ids(k, 4 * BS + 1)), GREEDY)
    d = diag(llm, doc)
    assert (d["reason"], d["detail"], d["cached_tokens"], d["reusable_tokens"]) == (
        "evicted", "pool", 0, 4 * BS)
    llm.reset_prefix_cache()
    d = diag(llm, doc)
    assert (d["reason"], d["detail"]) == ("evicted", "reset")


def test_evicted_from_the_host_tier_names_it():
    page = 2 * 4 * BS * 4 * 32 * 4  # bytes of one page of builtin:tiny (float32)
    for budget, expect in ((4 * page, ("evicted", "host")), (64 * page, ("none", None))):
        llm = make(num_pages=12, host_cache_bytes=budget, tier_load_policy="always")
        doc = ids(2, 4 * BS + 1)
        diag(llm, doc)
        for k in range(3, 8):  # pushed out of the pool (written back), then of the tier
            llm.generate(p(ids(k, 4 * BS + 1)), GREEDY)
            llm.engine.tiers.flush()
        d = diag(llm, doc)
        assert (d["reason"], d["detail"]) == expect
        assert d["cached_tokens"] == (0 if expect[0] == "evicted" else 4 * BS)


def test_admission_tenant_quota_recycles_its_own_pages():
    llm = make(num_pages=12, tenant_quota_fraction=0.5)
    doc = ids(4, 4 * BS + 1)
    diag(llm, doc, tenant="a")
    for k in range(5, 8):
        llm.generate(p(ids(k, 4 * BS + 1)), GREEDY, tenant="a")
    d = diag(llm, doc, tenant="a")
    assert (d["reason"], d["detail"], d["cached_tokens"]) == ("admission", "tenant_quota", 0)


def test_expired_pin():
    now = [1000.0]
    llm = make(num_pages=12)
    llm.engine.cache.pins.clock = lambda: now[0]
    doc = ids(5, 4 * BS + 1)
    diag(llm, doc, pin_ttl_s=5)
    now[0] += 10  # the pin expires; the next flood evicts the pages it held
    for k in range(6, 9):  # 9 pages each: the pinned pages are needed
        llm.generate(p(ids(k, 8 * BS + 1)), GREEDY)
    d = diag(llm, doc)
    assert (d["reason"], d["detail"], d["cached_tokens"]) == ("expired", "pin", 0)


def test_other_namespace_model_changed_prompt_logprobs_and_short():
    llm = make()
    doc = ids(6, 3 * BS + 2)
    diag(llm, doc, cache_salt="s1")
    d = diag(llm, doc, cache_salt="s2")
    assert (d["reason"], d["detail"], d["cached_tokens"]) == ("other_namespace", "cache_salt", 0)
    assert d["divergence"]["earlier_after"] is None  # no text of another salt's prompt
    eng = llm.engine
    outs: dict = {}
    for rid, version, ref in (("ad-1", 1, None), ("ad-2", 2, "ad-1")):
        eng.add_request(rid, ids(7, 3 * BS + 2), GREEDY, extra_keys=("adapter", "x", version),
                        diagnostics=DiagnosticsRequest(compare_to=ref))
        while eng.has_unfinished_requests():
            for o in eng.step():
                outs[o.request_id] = o
    d = outs["ad-2"].extra["cache_diagnostics"]
    assert (d["reason"], d["compare_to_found"], d["cached_tokens"]) == ("model_changed", True, 0)
    d = diag(llm, doc, cache_salt="s1", params=SamplingParams(max_tokens=1, prompt_logprobs=1))
    assert (d["reason"], d["cached_tokens"]) == ("prompt_logprobs", 0)
    d = diag(llm, ids(8, BS))
    assert (d["reason"], d["prompt_tokens"]) == ("shorter_than_one_page", BS)


def test_chat_names_the_section_of_a_divergence():
    llm = make(num_pages=40)
    sys_msg = {"role": "system", "content": "You are a careful assistant. " * 6}
    conv = [sys_msg, {"role": "user", "content": "Tell me about prefix caching, please."}]
    rid = llm.chat(conv, GREEDY, **ON)[0].request_id
    edited = [sys_msg, {"role": "user", "content": "Tell me about suffix caching, please."}]
    d = llm.chat(edited, GREEDY, **ON)[0].extra["cache_diagnostics"]
    assert d["reason"] == "prefix_changed"
    assert d["divergence"]["section"] == "messages[1]"
    assert d["divergence"]["after"].startswith("suffix")
    assert d["divergence"]["earlier_after"].startswith("prefix")
    new_sys = [{"role": "system", "content": "You are a hasty assistant. " * 6}, conv[1]]
    d = llm.chat(new_sys, GREEDY, cache_diagnostics={"compare_to": rid}
                 )[0].extra["cache_diagnostics"]
    assert (d["reason"], d["divergence"]["section"]) == ("prefix_changed", "system")


def test_bad_values_name_the_parameter():
    llm = make()
    for bad in ("yes", {"compare_to": 3}, {"other": 1}):
        with pytest.raises(ParamError) as e:
            llm.generate(p(ids(0, 20)), GREEDY, cache_diagnostics=bad)
        assert e.value.param.startswith("cache_diagnostics")
    assert llm.stats()["pages_live"] == 0 and not llm.engine.requests


def test_a_changed_tool_description_is_in_the_tools_section():
    llm = LLM("builtin:tiny", num_pages=64, block_size=BS, max_model_len=512)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {},
                                             "description": "Weather for a city, today."}}
    edited = {"type": "function", "function": {**tool["function"],
                                               "description": "Forecast for a city, today."}}
    conv = [{"role": "system", "content": "You are a careful assistant. " * 4},
            {"role": "user", "content": "What is the weather in Paris?"}]
    rid = llm.chat(conv, GREEDY, tools=[tool], **ON)[0].request_id
    d = llm.chat(conv, GREEDY, tools=[edited], cache_diagnostics={"compare_to": rid}
                 )[0].extra["cache_diagnostics"]
    assert (d["reason"], d["divergence"]["section"]) == ("prefix_changed", "tools")
    assert d["cached_tokens"] == d["reusable_tokens"] == d["divergence"]["token"] // BS * BS
    assert (d["divergence"]["after"], d["divergence"]["earlier_after"]) == (
        "Forecast", "Weather ")
