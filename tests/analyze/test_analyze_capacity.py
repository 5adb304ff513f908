import json

import pytest
from analyze_helpers import tokreq

from prefixcache.analyze.capacity import (
    capacity_tokens,
    kv_bytes_per_token,
    kv_bytes_per_token_from_config,
)
from prefixcache.analyze.replay import ReplayCache, ReplayConfig
from prefixcache.analyze.sweep import (
    block_size_sweep,
    capacity_points,
    capacity_sweep,
    fitting_block_sizes,
)


def test_kv_bytes_per_token(tmp_path):
    assert kv_bytes_per_token(32, 8, 128, 2) == 131072  # Llama-3-8B in bf16
    cfg = {"num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
           "hidden_size": 1536, "torch_dtype": "bfloat16"}  # Qwen2-1.5B
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert kv_bytes_per_token_from_config(tmp_path) == 2 * 28 * 2 * 128 * 2 == 28672
    assert kv_bytes_per_token_from_config(tmp_path, "float32") == 57344


def test_capacity_tokens():
    assert capacity_tokens(None, 4_000_000, 1000) == 4000
    assert capacity_tokens(100) == 100 and capacity_tokens() is None
    with pytest.raises(ValueError):
        capacity_tokens(None, 100)
    with pytest.raises(ValueError):
        capacity_tokens(100, 100, 1)


def test_capacity_points_run_from_one_page_to_unlimited():
    pts = capacity_points(100, 16, extra=5000, points=4)
    # pages 1, 100^(1/3)=4.6 -> 5, 100^(2/3)=21.5 -> 22, 100; then the asked 5000, unlimited
    assert pts == [16, 80, 352, 1600, 5000, None]
    assert capacity_points(1, 16) == [16, None]
    assert capacity_points(0, 32, points=3) == [32, None]
    with pytest.raises(ValueError, match="block_size"):
        capacity_points(10, 0)


def _reuse_log():
    """Ten conversations of 5 growing turns over a shared 64-token system prefix, sent
    interleaved: a small cache loses the prefixes, a larger one keeps them."""
    sys_ = list(range(1000, 1064))
    reqs = []
    for turn in range(5):
        for conv in range(10):
            body = [conv * 100 + k for k in range(16 * (turn + 1))]
            reqs.append(tokreq(f"c{conv}t{turn}", sys_ + body))
    return reqs


def test_capacity_sweep_rises_with_the_working_set():
    reqs = _reuse_log()
    cfg = ReplayConfig(block_size=16)
    replays = ReplayCache(reqs, cfg)
    unb = replays.get(cfg)
    assert unb.stats["published_pages"] == 4 + 10 * 5  # 4 prefix pages, 5 body pages each
    caps = capacity_points(unb.stats["published_pages"], 16)
    assert caps[0] == 16 and caps[-2] == 54 * 16 and caps[-1] is None
    sweep = capacity_sweep(replays, cfg, caps)
    rates = [p.hit_rate for p in sweep]
    assert all(a <= b for a, b in zip(rates, rates[1:]))
    assert len(set(rates)) >= 3  # not a flat line
    assert rates[0] == 0.0 and sweep[0].failed == len(reqs)  # one page runs nothing
    assert rates[-1] == unb.hit_rate and sweep[-1].evictions == 0


def test_block_size_sweep_skips_sizes_over_the_capacity():
    reqs = _reuse_log()
    cfg = ReplayConfig(block_size=16, capacity_tokens=40)
    assert fitting_block_sizes(40) == ([16, 32], [64, 128, 256])
    pts = block_size_sweep(ReplayCache(reqs, cfg), cfg)
    assert [p.block_size for p in pts] == [16, 32]
