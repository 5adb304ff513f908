"""The torch-free comparison and records behind cache-miss diagnostics: divergence,
reusable pages, sections, bounded per-tenant records, and the order of reasons."""
from __future__ import annotations

import numpy as np
import pytest

from prefixcache.cache.miss_diagnosis import (
    DropLog,
    Facts,
    PromptRecord,
    ResponseLog,
    Section,
    decide,
    find_sections,
    first_divergence,
    locate,
    reusable_tokens,
)

BS = 16


def test_divergence_and_whole_reusable_pages():
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence(np.array([5, 6]), (5, 6)) == 2
    assert first_divergence([], [1]) == 0
    assert reusable_tokens(40, 100, BS) == 32
    assert reusable_tokens(100, 49, BS) == 48  # never the last prompt token
    assert reusable_tokens(100, 48, BS) == 32
    assert reusable_tokens(0, 10, BS) == 0


def test_sections_locate_innermost_then_template_then_prompt():
    text = "<sys>be brief</sys><u>hello there</u>"
    secs = find_sections(text, [("system", "be brief"), ("messages[1]", "hello there"),
                                ("tools", "absent")])
    assert secs == [Section("system", 5, 13), Section("messages[1]", 22, 33)]
    assert locate(secs, 6) == "system"
    assert locate(secs, 25) == "messages[1]"
    assert locate(secs, 15) == "system +template"
    assert locate(secs, 0) == "prompt"


def test_records_are_bounded_and_per_tenant():
    log = ResponseLog(per_tenant=2, max_tenants=2)
    rec = PromptRecord(tuple(range(40)), 40, None, "m")
    for i in range(3):
        log.add("a", f"r{i}", rec)
    assert log.get("a", "r0") is None and log.get("a", "r2") == rec
    assert log.get("b", "r2") is None  # another tenant: not found, like an unknown id
    log.add("b", "x", rec)
    log.add("c", "y", rec)  # the least recently used tenant goes
    assert log.get("a", "r2") is None and len(log) == 2
    assert log.best("c", list(range(20)), min_common=BS) == ("y", rec)
    assert log.best("c", [0, 1, 99], min_common=BS) is None
    drops = DropLog(per_tenant=1)
    drops.record("a", b"h1", "pool")
    drops.record("a", b"h2", "quota")
    assert (drops.cause("a", b"h1"), drops.cause("a", b"h2"), drops.cause("b", b"h2")) == (
        None, "quota", None)
    with pytest.raises(ValueError):
        drops.record("a", b"h3", "lost")


def _facts(**kw) -> Facts:
    base = dict(num_prompt_tokens=65, cached_tokens=0, block_size=BS, read_cache=True,
                hit_limit=64, cache_salt=None, model_key="m")
    return Facts(**(base | kw))  # type: ignore[arg-type]


def test_reason_order():
    earlier = PromptRecord(tuple(range(80)), 70, None, "m")
    assert decide(_facts(read_cache=False)) == ("prompt_logprobs", None)
    assert decide(_facts(num_prompt_tokens=16, hit_limit=0)) == ("shorter_than_one_page", None)
    assert decide(_facts(cached_tokens=64)) == ("none", None)
    assert decide(_facts(earlier=PromptRecord((1,), 1, None, "n"), common=1)) == (
        "model_changed", None)
    assert decide(_facts(earlier=PromptRecord((1,), 1, "s", "m"), common=1)) == (
        "other_namespace", "cache_salt")
    assert decide(_facts(first_missed_drop="pin")) == ("expired", "pin")
    assert decide(_facts(first_missed_drop="ttl")) == ("expired", "ttl")
    assert decide(_facts(first_missed_drop="quota")) == ("admission", "tenant_quota")
    assert decide(_facts(earlier=earlier, common=70)) == ("evicted", None)
    assert decide(_facts(earlier=earlier, common=70, first_missed_drop="pool")) == (
        "evicted", "pool")
    # the earlier prompt diverged inside the first missed page: the drop is not the cause
    assert decide(_facts(earlier=earlier, common=5, first_missed_drop="pool")) == (
        "prefix_changed", None)
    assert decide(_facts()) == ("never_seen", None)
