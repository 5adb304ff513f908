"""Agent sessions through the offline API (builtin:tiny, CPU): a session's transcript
(prompt and output pages) survives a flood between calls, close frees it, an abort
leaves nothing, and bad ids are refused naming the parameter."""
from __future__ import annotations

import pytest

from prefixcache import LLM, SamplingParams
from prefixcache.cache.invariants import check_invariants
from prefixcache.sampling_params import ParamError

BS = 16
OUT = SamplingParams(max_tokens=BS + 1, temperature=0.0, ignore_eos=True)
GREEDY = SamplingParams(max_tokens=2, temperature=0.0)


def ids(k: int, n: int) -> list[int]:
    return [(1000 * k + 7 * t) % 260 + 3 for t in range(n)]


def make(ttl: float, **kw) -> LLM:
    return LLM("builtin:tiny", num_pages=24, block_size=BS, max_model_len=256,
               session_ttl_s=ttl, **kw)


def agent_turn(llm: LLM, prompt: list[int], **kw):
    out = llm.generate({"prompt_token_ids": prompt}, OUT, session_id="job-1", **kw)[0]
    return out, prompt + out.outputs[0].token_ids


def test_transcript_with_output_survives_a_flood_only_with_sessions():
    for ttl, expect in ((300.0, 5 * BS), (0.0, 0)):
        llm = make(ttl)
        first, transcript = agent_turn(llm, ids(0, 4 * BS), tenant="a")
        # prompt 64 + output 17: 80 tokens computed, 5 full pages published and kept
        s = llm.stats()
        assert (s["sessions_live"], s["session_pages_held"]) == ((1, 5) if ttl else (0, 0))
        for k in range(1, 12):  # over twice the pool of unrelated requests
            llm.generate({"prompt_token_ids": ids(k, 4 * BS - 1)}, GREEDY, tenant="a")
        assert llm.stats()["evictions"] > 20
        nxt, _ = agent_turn(llm, transcript + ids(50, 9), tenant="a")
        assert nxt.num_cached_tokens == expect
        s = llm.stats()
        assert s["session_hits"] == (1 if ttl else 0)
        assert s["session_pages_evicted"] == 0 and s["pages_live"] == 0
        check_invariants(llm.engine.cache)


def test_another_tenants_same_session_id_is_another_session():
    llm = make(300.0)
    agent_turn(llm, ids(0, 3 * BS), tenant="a")
    assert llm.close_session("job-1", tenant="b") is False
    assert llm.stats()["sessions_live"] == 1
    assert llm.close_session("job-1", tenant="a") is True
    s = llm.stats()
    assert (s["sessions_live"], s["session_pages_held"], s["pins"]) == (0, 0, 0)
    assert s["pages_cached"] == 0  # freed at once, nothing else held them
    check_invariants(llm.engine.cache)


def test_abort_mid_call_leaves_no_pin_and_no_page():
    llm = make(300.0)
    _, transcript = agent_turn(llm, ids(0, 3 * BS))
    eng = llm.engine
    eng.add_request("r-abort", transcript + ids(9, 5), OUT, session_id="job-1")
    eng.step()  # its prefill: the old transcript's pin is released
    assert eng.abort_request("r-abort")
    eng.step()
    s = llm.stats()
    assert (s["sessions_live"], s["session_pages_held"], s["pins"], s["pages_live"]) == (
        0, 0, 0, 0)
    check_invariants(eng.cache)


def test_bad_session_ids_are_refused_naming_the_parameter():
    llm = make(300.0)
    for bad in ("", "x" * 257, 7):
        with pytest.raises(ParamError, match="session_id"):
            llm.generate({"prompt_token_ids": ids(0, 20)}, GREEDY, session_id=bad)
        with pytest.raises(ParamError, match="session_id"):
            llm.close_session(bad)  # type: ignore[arg-type]
    assert llm.stats()["sessions_live"] == 0
    with pytest.raises(ValueError, match="session_ttl_s"):
        make(-1.0)


def test_with_a_host_tier_forced_evictions_demote_and_the_next_call_loads_them():
    page = 2 * 4 * BS * 4 * 32 * 4  # bytes of one page of builtin:tiny (float32)
    llm = LLM("builtin:tiny", num_pages=12, block_size=BS, max_model_len=256,
              session_ttl_s=300.0, max_pinned_fraction=1.0, host_cache_bytes=64 * page,
              tier_load_policy="always")
    _, transcript = agent_turn(llm, ids(0, 4 * BS))
    assert llm.stats()["session_pages_held"] == 5
    # One unrelated request needs 11 of the 12 pages: only session pages are left to evict.
    big = llm.generate({"prompt_token_ids": ids(7, 11 * BS - 1)}, GREEDY)[0]
    assert big.outputs[0].finish_reason == "length"
    llm.engine.tiers.flush()
    s = llm.stats()
    assert s["session_pages_evicted"] >= 4 and s["pin_pages_demoted"] == s[
        "session_pages_evicted"]
    assert s["sessions_live"] == 1  # the transcript waits in the host tier
    nxt, _ = agent_turn(llm, transcript + ids(50, 9))
    assert nxt.num_cached_tokens == 5 * BS
    assert llm.stats()["session_hits"] == 1
    check_invariants(llm.engine.cache)
