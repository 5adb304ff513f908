"""Usage normalised per provider, priced from the analyze price sheets, and cost with and
without each layer per tenant."""
from __future__ import annotations

import pytest

from prefixcache.gateway.accounting import NormalUsage, cost, cost_uncached, normalize
from tests.gateway.conftest import KEYS, A, B, chat, make_gateway, run

FIXTURES = [
    ("openai", {"prompt_tokens": 2006, "completion_tokens": 300,
                "prompt_tokens_details": {"cached_tokens": 1920}},
     NormalUsage(86, 1920, 0, 0, 300)),
    ("openai", {"prompt_tokens": 3000, "completion_tokens": 10, "cache_write_tokens": 1000,
                "prompt_tokens_details": {"cached_tokens": 1024}},  # GPT-5.6 writes
     NormalUsage(976, 1024, 1000, 0, 10)),
    ("anthropic", {"input_tokens": 50, "cache_creation_input_tokens": 3000,
                   "cache_read_input_tokens": 10000, "output_tokens": 500,
                   "cache_creation": {"ephemeral_5m_input_tokens": 1000,
                                      "ephemeral_1h_input_tokens": 2000}},
     NormalUsage(50, 10000, 1000, 2000, 500)),
    ("anthropic", {"input_tokens": 7, "cache_creation_input_tokens": 40,
                   "cache_read_input_tokens": 0, "output_tokens": 5},  # no 5m/1h split
     NormalUsage(7, 0, 40, 0, 5)),
    ("deepseek", {"prompt_tokens": 1000, "completion_tokens": 20,
                  "prompt_cache_hit_tokens": 832, "prompt_cache_miss_tokens": 168},
     NormalUsage(168, 832, 0, 0, 20)),
    ("prefixcache", {"prompt_tokens": 100, "completion_tokens": 4,
                     "prompt_tokens_details": {"cached_tokens": 96}},
     NormalUsage(4, 96, 0, 0, 4)),
    ("vllm", {"prompt_tokens": 100, "completion_tokens": 4},  # no details: unknown -> 0
     NormalUsage(100, 0, 0, 0, 4)),
]


@pytest.mark.parametrize("provider, usage, expected", FIXTURES)
def test_usage_is_normalised_for_each_provider(provider, usage, expected):
    assert normalize(provider, usage) == expected


def test_prices_come_from_the_sheets_with_5m_and_1h_writes():
    u = NormalUsage(1000, 1000, 1000, 1000, 100)
    # claude-sonnet-4-5: input 3, read 0.1x, 5m write 1.25x, 1h write 2x, output 15 per M
    assert cost("anthropic", "claude-sonnet-4-5", u) == pytest.approx(
        (1000 * 3 + 1000 * 0.3 + 1000 * 3.75 + 1000 * 6 + 100 * 15) / 1e6)
    assert cost_uncached("anthropic", "claude-sonnet-4-5", u) == pytest.approx(
        (4000 * 3 + 100 * 15) / 1e6)
    # gpt-4.1: input 2, cached 0.5, output 8 per M (dated names use the family's row)
    v = NormalUsage(1000, 1000, 0, 0, 100)
    assert cost("openai", "gpt-4.1-2025-04-14", v) == pytest.approx(
        (1000 * 2 + 1000 * 0.5 + 100 * 8) / 1e6)
    assert cost("deepseek", "deepseek-chat", v) == pytest.approx(
        (1000 * 0.28 + 1000 * 0.028 + 100 * 0.42) / 1e6)


def test_stats_report_cost_with_and_without_each_layer_per_tenant(emulators):
    emu, url = emulators("deepseek")
    gw = make_gateway([("ds", url, "deepseek", ("deepseek-chat",))])
    body = chat("deepseek-chat", "How long is the refund window? " * 80)

    async def go(c):
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=body, headers=A)).status_code \
                == 200
        await c.post("/v1/chat/completions", json={**body, "max_tokens": 9}, headers=A)
        mine = (await c.get("/v1/gateway/stats", headers=A)).json()
        others = (await c.get("/v1/gateway/stats", headers=B)).json()
        admin = (await c.get("/v1/gateway/stats",
                             headers={"Authorization": "Bearer sk-ops"})).json()
        metrics = (await c.get("/metrics")).text
        return mine, others, admin, metrics

    mine, others, admin, metrics = run(go, gw)
    s = mine["alice"]
    assert list(mine) == ["alice"] and list(others) == ["bob"]
    assert others["bob"]["upstream_calls"] == 0 and set(admin) >= {"alice", "bob"}
    assert s["requests"]["miss"] == 2 and s["requests"]["exact"] == 2
    assert s["upstream_calls"] == 2
    # the 4th request (max_tokens 9) read the first one's prefix from DeepSeek's cache
    assert s["cache_read_tokens"] > 0
    first, fourth = (normalize("deepseek", u) for u in emu.usages)
    assert first.cache_read == 0 and fourth.cache_read == first.prompt // 64 * 64
    c1, c4 = (cost("deepseek", "deepseek-chat", u) for u in (first, fourth))
    assert s["cost_actual"] == pytest.approx(c1 + c4)
    assert s["cost_without_exact"] == pytest.approx(3 * c1 + c4)  # two hits replay call 1
    assert s["cost_without_prefix"] == pytest.approx(
        3 * c1 + cost_uncached("deepseek", "deepseek-chat", fourth))
    assert s["tokens_saved"] == 2 * (first.prompt + first.output)
    assert 'prefixcache_gateway_requests_total{layer="exact",tenant="alice"} 2.0' in metrics
    assert all(k not in metrics for k in KEYS)
