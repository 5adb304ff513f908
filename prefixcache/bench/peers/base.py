"""What every peer provides, and the context all peers share.

A peer runs a workload and returns per-request results. All peers of one bench run get
the same :class:`PeerContext`: the same model directory, dtype and thread count, which
the results record. A peer that cannot run here raises :class:`PeerUnavailable` from
``check`` with a message saying why and how to fix it; the runner prints it and skips.
"""
from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import prefixcache.paths as paths
from prefixcache.bench.metrics import RequestResult
from prefixcache.bench.prompts import Prompt
from prefixcache.bench.workloads import BenchRequest


class PeerUnavailable(RuntimeError):
    """The peer cannot run here; the message says why and how to install it."""


@dataclass
class PeerContext:
    """Settings every peer of one bench run shares.

    Attributes:
        model: what our engine loads (a Hugging Face directory or ``builtin:...``).
        model_dir: the Hugging Face directory, or ``None`` (other peers need one).
        dtype: ``float32`` or ``bfloat16``. threads: compute threads per peer; 0 for
            each engine's own default (serving peers only).
        block_size: our page size in tokens. max_model_len: the model's context length
            (prompt + output tokens, its ``max_position_embeddings``); every request of
            the run fits it (see :mod:`prefixcache.bench.fit`).
        kv_cache_gib: KV pool size given to engines that take one.
        api: ``completions`` or ``chat`` for serving peers.
        work_dir: scratch space (server logs, GGUF files); default
            :func:`prefixcache.paths.scratch_dir`.
        peers_dir: where ``scripts/install_peers.sh`` put the peer venvs; default
            :func:`prefixcache.paths.peers_dir` (``$PREFIXCACHE_PEERS``, or ``.peers`` in
            the repository).
        gguf_file: the GGUF file the model came from (``model_dir`` is then its
            dequantized copy), else ``None``. Our server and llama-server load this file
            itself; ``quantization`` is what our server is given (``auto``: GGUF weights
            stay quantized).
    """

    model: str
    model_dir: Path | None
    dtype: str = "float32"
    threads: int = 2
    block_size: int = 16
    max_model_len: int = 8192
    kv_cache_gib: float = 2.0
    api: str = "completions"
    work_dir: Path = field(default_factory=paths.scratch_dir)
    peers_dir: Path = field(default_factory=paths.peers_dir)
    tenants: tuple[str, ...] = ()
    eos_token_id: int | None = None
    gguf_file: Path | None = None
    quantization: str = "auto"


@dataclass
class PeerRun:
    results: list[RequestResult]
    wall_s: float
    peak_rss: int | None = None
    prefill_tokens_computed: int | None = None
    concurrency: int | None = None  # what the peer actually ran at, when it differs
    cached_tokens_total: int | None = None  # total reuse, for peers without per-request counts
    cache_stats: dict = field(default_factory=dict)


Progress = Callable[[RequestResult], None]


class Peer(ABC):
    """One engine under test. ``modes`` it can run in: ``offline`` / ``serving``."""

    name: str = ""
    modes: tuple[str, ...] = ()
    description: str = ""

    def __init__(self, mode: str):
        self.mode = mode

    @property
    def label(self) -> str:
        return f"{self.name} ({self.mode})"

    def check(self, ctx: PeerContext) -> None:
        """Raise :class:`PeerUnavailable` if this peer cannot run with ``ctx``."""
        return None  # optional hook: by default every peer can run

    def start(self, ctx: PeerContext) -> None:
        """Load the model / start the server once for all workloads of the run."""
        return None  # optional hook: by default there is nothing to load

    @abstractmethod
    def run(self, workload: str, reqs: list[BenchRequest], prompts: dict[str, Prompt], *,
            concurrency: int, salt: str, progress: Progress | None = None,
            time_scale: float = 1.0) -> PeerRun:
        """Run one workload from a cold cache (``salt`` is unique per run: peers that
        keep a cache across runs put it in the cache namespace)."""

    def stop(self) -> None:
        """Release everything ``start`` acquired; safe to call twice."""
        return None  # optional hook: by default nothing was acquired

    def detail(self) -> dict:
        """Versions and settings to record in the results."""
        return {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
