"""``/metrics`` exposes the KV tiers' counters from ``LLMEngine.stats()`` (per tier), and
nothing about tiers when the engine has none."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixcache import LLM, SamplingParams
from prefixcache.server.metrics import EngineStatsCollector

G = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
A = [1] + [(7 * i) % 250 + 5 for i in range(150)]
B = [1] + [(11 * i) % 250 + 9 for i in range(150)]


def scrape(stats: dict) -> dict[str, float]:
    col = EngineStatsCollector()
    col.snapshot = stats
    reg = CollectorRegistry(auto_describe=False)
    reg.register(col)  # type: ignore[arg-type]
    text = generate_latest(reg).decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text)
            for s in fam.samples}


def test_tier_metrics_match_stats(tmp_path):
    llm = LLM("builtin:tiny", num_pages=12, host_cache_bytes=1 << 22,
              disk_cache_dir=str(tmp_path), tier_load_policy="always")
    for p in (A, B, A):
        llm.generate([{"prompt_token_ids": p}], G)
        llm.engine.tiers.flush()  # type: ignore[union-attr]
    s = llm.stats()
    m = scrape(s)
    assert m["host_tier_hit_tokens_total"] == s["host_tier_hit_tokens"] == 7 * 16
    assert m["disk_tier_hit_tokens_total"] == 0
    assert m["host_tier_stores_total"] == s["host_tier_stores"] >= 1
    assert m["disk_tier_stores_total"] == s["disk_tier_stores"] >= 1
    assert m["disk_tier_bytes_used"] == s["disk_tier_bytes_used"] > 0
    assert m["host_tier_pages"] == s["host_tier_pages"]
    assert m["kv_tier_store_dropped_total"] == 0


def test_no_tier_metrics_without_tiers():
    llm = LLM("builtin:tiny", num_pages=12)
    m = scrape(llm.stats())
    assert "kv_pages_total" in m
    assert not [k for k in m if "tier" in k]


def test_pin_demotion_metrics_match_stats():
    llm = LLM("builtin:tiny", num_pages=12, host_cache_bytes=1 << 22,
              tier_load_policy="always")
    llm.pin_prefix({"prompt_token_ids": A[:64]}, ttl_s=300)
    llm.generate([{"prompt_token_ids": B[:1] + [(3 * i) % 250 + 4 for i in range(189)]}], G)
    llm.engine.tiers.flush()  # type: ignore[union-attr]
    m = scrape(llm.stats())
    assert (m["kv_pages_pinned_demoted"], m["kv_pin_pages_demoted_total"]) == (4, 4)
    assert (m["host_tier_pinned_entries"], m["host_tier_pinned_bytes"]) == (4, 4 * 65536)
    assert (m["kv_pages_pinned"], m["host_tier_pinned_evictions_total"]) == (0, 0)
