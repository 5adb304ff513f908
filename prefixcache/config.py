"""Engine configuration: one dataclass, validated, with the field's standard names."""
from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
          "half": torch.float16, "float": torch.float32}

DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB when num_pages is not given


@dataclass
class EngineConfig:
    """Everything the engine needs to know besides the requests.

    Attributes:
        model: a Hugging Face model directory, or ``"builtin:tiny"``.
        block_size: tokens per KV page.
        num_pages: KV pool size in pages; ``None`` sizes it from ``kv_cache_bytes``.
        kv_cache_bytes: KV pool memory when ``num_pages`` is ``None`` (bytes).
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
        max_num_seqs: most requests running at once.
        max_model_len: longest sequence (prompt + output, tokens); ``None`` takes the
            model's ``max_position_embeddings``, capped by the pool's capacity.
        enable_prefix_caching: reuse published pages across requests.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``.
        deterministic: batch-invariant arithmetic; cold and warm runs are bit-identical.
        seed: seed of the engine's generator (unseeded sampling).
        shuffle_seed: start the page free list shuffled (non-contiguous pages; tests).
        cache_aware_window_s: how much earlier (seconds) a request whose whole prompt is
            cached counts as having arrived, when ordering the waiting queue. A cold
            request is passed only by requests that arrived less than this after it,
            which bounds its extra wait (aging). ``0`` gives first-come-first-served.
        hash_root_seed: root seed of page hashes (default: see ``cache/hashing.py``).
        max_waiting_requests: admission limit of the waiting queue (server answers
            429 beyond it); ``None`` for unbounded.
        num_threads: torch intra-op threads; ``None`` leaves torch's default.
    """

    model: str = "builtin:tiny"
    block_size: int = 16
    num_pages: int | None = None
    kv_cache_bytes: int = DEFAULT_KV_CACHE_BYTES
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int | None = None
    enable_prefix_caching: bool = True
    device: str = "cpu"
    dtype: str = "float32"
    deterministic: bool = False
    seed: int = 0
    shuffle_seed: int | None = None
    cache_aware_window_s: float = 0.5
    hash_root_seed: str | None = None
    max_waiting_requests: int | None = None
    num_threads: int | None = None

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, msg: str) -> None:
            if not ok:
                raise ValueError(f"{name}: {msg}")

        need(self.block_size >= 1, "block_size", f"must be >= 1, got {self.block_size}")
        need(self.num_pages is None or self.num_pages >= 1, "num_pages",
             f"must be >= 1, got {self.num_pages}")
        need(self.kv_cache_bytes > 0, "kv_cache_bytes", "must be > 0")
        need(self.max_num_batched_tokens >= 1, "max_num_batched_tokens",
             f"must be >= 1, got {self.max_num_batched_tokens}")
        need(self.max_num_seqs >= 1, "max_num_seqs", f"must be >= 1, got {self.max_num_seqs}")
        need(self.max_model_len is None or self.max_model_len >= 2, "max_model_len",
             "must be >= 2")
        need(self.dtype in DTYPES, "dtype", f"must be one of {sorted(set(DTYPES))}")
        need(self.cache_aware_window_s >= 0, "cache_aware_window_s", "must be >= 0")
        try:
            torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"device: {exc}") from None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
