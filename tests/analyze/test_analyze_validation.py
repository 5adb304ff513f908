"""The replay against DeepSeek's recorded prefix-cache hits (shared mini-swe-agent runs).

See benchmarks/analyze/RESULTS.md for the figures and the causes of the difference.
"""
import pytest

from helpers.data import shared_data
from prefixcache.analyze.cost import recorded_cost
from prefixcache.analyze.encode import encode_requests
from prefixcache.analyze.logs import load_logs
from prefixcache.analyze.pricing import parse_price_specs
from prefixcache.analyze.replay import replay
from prefixcache.analyze.validate import compare_recorded
from prefixcache.text.loading import load_tokenizer


@pytest.fixture(scope="module")
def deepseek_runs():
    root = shared_data("agent_trajectories") / "mini-swe-agent" / "deepseek_pr816"
    shared_data("tokenizers")
    reqs = load_logs(sorted(root.glob("*.traj.json")))
    trs, info = encode_requests(reqs, load_tokenizer("qwen2"))
    return trs


def test_replay_comes_close_to_recorded_cached_tokens(deepseek_runs):
    v = compare_recorded(deepseek_runs, replay(deepseek_runs, block_size=64))
    assert v["calls"] == 153 and v["providers"] == ["deepseek"]
    assert v["recorded_prompt_tokens"] == 2098444 and v["recorded_cached_tokens"] == 2016064
    assert abs(v["token_ratio"] - 1) < 0.03  # qwen2 vs DeepSeek's tokenizer and template
    assert abs(v["replayed_hit_rate"] - v["recorded_hit_rate"]) < 0.025
    assert v["mean_abs_diff"] < 0.04 and v["within_5_points"] > 0.85


def test_recorded_usage_priced_by_the_deepseek_sheet_is_the_logged_cost(deepseek_runs):
    (p,) = parse_price_specs(["deepseek"])
    rec = recorded_cost(deepseek_runs, p)
    assert rec["requests"] == 153
    assert rec["cost"] == pytest.approx(rec["logged_cost"], rel=1e-9)
    (django0,) = [t for t in deepseek_runs if t.request_id == "django__django-14752#0"]
    first = recorded_cost([django0], p)  # 320 hit, 1,675 miss, 93 out
    assert first["cost"] == pytest.approx((320 * 0.028 + 1675 * 0.28 + 93 * 0.42) / 1e6,
                                          rel=1e-12)
    assert first["cost"] == pytest.approx(django0.request.extra["recorded_cost"], rel=1e-12)
