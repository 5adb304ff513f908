"""Cache capacity: in tokens, or in bytes given the model's KV size per token.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element;
:func:`kv_bytes_per_token_from_config` reads those from a Hugging Face ``config.json``.
"""
from __future__ import annotations

import json
from pathlib import Path

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1, "int8": 1}


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int,
                       dtype_bytes: int = 2) -> int:
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token_from_config(path: str | Path, dtype: str | None = None) -> int:
    """KV bytes per token of a model from its ``config.json`` (or its folder).

    Raises:
        ValueError: the config lacks the layer or head counts.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg = cfg.get("text_config", cfg)
    try:
        layers = cfg["num_hidden_layers"]
        heads = cfg["num_attention_heads"]
    except KeyError as exc:
        raise ValueError(f"{path}: no {exc.args[0]}") from None
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dt = dtype or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"
    if dt not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dt!r}; one of {', '.join(DTYPE_BYTES)}")
    return kv_bytes_per_token(layers, kv_heads, head_dim, DTYPE_BYTES[dt])


def capacity_tokens(capacity_tokens: int | None = None, capacity_bytes: int | None = None,
                    kv_bytes: int | None = None) -> int | None:
    """The cache capacity in tokens (``None``: unlimited).

    Raises:
        ValueError: both or neither of bytes/kv-bytes given, or non-positive values.
    """
    if capacity_tokens is not None and capacity_bytes is not None:
        raise ValueError("give the capacity in tokens or in bytes, not both")
    if capacity_bytes is not None:
        if not kv_bytes:
            raise ValueError("a capacity in bytes needs the KV bytes per token")
        if capacity_bytes <= 0 or kv_bytes <= 0:
            raise ValueError("capacity and KV bytes per token must be positive")
        return capacity_bytes // kv_bytes
    if capacity_tokens is not None and capacity_tokens <= 0:
        raise ValueError("capacity must be positive")
    return capacity_tokens
