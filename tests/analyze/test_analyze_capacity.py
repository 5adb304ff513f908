import json

import pytest

from prefixcache.analyze.capacity import (
    capacity_tokens,
    kv_bytes_per_token,
    kv_bytes_per_token_from_config,
)
from prefixcache.analyze.sweep import capacity_points


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


def test_capacity_points_span_largest_request_to_footprint():
    pts = capacity_points(10_000, 1_000, 16, extra=5000, points=4)
    assert pts[0] == 1008 and pts[-1] == 10_000 and 5000 in pts
    assert all(p % 16 == 0 for p in pts if p != 5000) and pts == sorted(pts)
    assert capacity_points(100, 500, 16) == [512]
