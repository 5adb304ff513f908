"""Engine configuration: one dataclass, validated, with the fields' standard names.

This is the one definition of the engine's options: ``LLM(**kwargs)`` takes these fields,
and every command line (``generate``, ``demo``, ``serve``, ``bench``) builds its engine
flags from them (``prefixcache/engine/args.py``). It also holds the one dtype table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

# The one dtype table: every alias a user may write, to the torch dtype it means.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
}
DTYPE_NAMES: dict[torch.dtype, str] = {torch.float32: "float32", torch.bfloat16: "bfloat16",
                                       torch.float16: "float16"}

GIB = 1 << 30
DEFAULT_KV_CACHE_BYTES = 1 << 30  # 1 GiB when num_pages is not given
DEFAULT_DISK_CACHE_BYTES = 8 << 30
# The page-hash root seed when PREFIXCACHE_HASH_SEED is unset; equal to
# prefixcache.cache.hashing.DEFAULT_ROOT_SEED (a test checks it).
DEFAULT_HASH_ROOT_SEED = "prefixcache/v1"
HASH_SEED_ENV = "PREFIXCACHE_HASH_SEED"
# The compute backends a model may run on (prefixcache.model.loader.make_backend).
COMPUTE_BACKENDS = ("auto", "torch", "cpu", "cpu-kernels")


# --quantization: how linear weights are held (prefixcache.model.quantize)
QUANTIZATION_MODES = ("auto", "none", "int4", "int8")
# --kv-cache-dtype: how the KV pool stores K and V (prefixcache.model.kv_pool); "auto" is
# the model's dtype, "int8" 8-bit codes with a float32 scale per token and KV head.
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "int8")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """The torch dtype of a name or alias in :data:`DTYPES`, or of a supported
    ``torch.dtype`` (float32, bfloat16, float16).

    Raises:
        ValueError: anything else (the message names ``dtype`` and the accepted names).
    """
    if isinstance(dtype, torch.dtype):
        if dtype in DTYPE_NAMES:
            return dtype
    elif isinstance(dtype, str) and dtype.lower() in DTYPES:
        return DTYPES[dtype.lower()]
    raise ValueError(f"dtype: unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")


def dtype_name(dtype: str | torch.dtype) -> str:
    """The canonical name (``"float32"``, ``"bfloat16"``, ``"float16"``) of a dtype or
    alias. Raises ValueError as :func:`resolve_dtype`."""
    return DTYPE_NAMES[resolve_dtype(dtype)]


def hash_root_seed_from_env() -> str:
    """``$PREFIXCACHE_HASH_SEED``, or :data:`DEFAULT_HASH_ROOT_SEED` when unset or empty.
    The one place the environment reaches the cache keys."""
    return os.environ.get(HASH_SEED_ENV) or DEFAULT_HASH_ROOT_SEED


def physical_ram_bytes() -> int | None:
    """The machine's physical RAM in bytes (``None`` where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def over_physical_ram(nbytes: int, shown: str) -> str | None:
    """The one host-RAM budget check (``EngineConfig`` and ``--host-cache-gib``): why
    ``nbytes`` (written ``shown``) is refused, more than the physical RAM, or ``None``."""
    ram = physical_ram_bytes()
    if ram is not None and ram > 0 and nbytes > ram:
        return f"{shown} is more than this machine's physical RAM ({ram / GIB:.2f} GiB)"
    return None


def _opt(help: str, unit: str = "", default: str | None = None, **meta) -> dict:
    """Field metadata read by ``engine/args.py``: the flag's help text, unit, and the
    wording of a default that is not a plain value."""
    return {"help": help, "unit": unit, "default_text": default, **meta}


@dataclass
class EngineConfig:
    """Everything the engine needs to know besides the requests.

    Each field's ``metadata`` holds its command-line help and unit.

    Attributes:
        model: a Hugging Face model directory, a hub id (``Qwen/Qwen3-0.6B``; a GGUF in a
            hub repository as ``org/name:Q4_K_M`` or ``org/name:FILE.gguf``), a ``.gguf``
            file, a registered name, or ``"builtin:tiny"``.
        revision: the hub revision (branch, tag or commit) of a hub id ``model``; ``None``
            is ``main``.
        block_size: tokens per KV page.
        num_pages: KV pool size in pages; ``None`` sizes it from ``kv_cache_bytes``.
        kv_cache_bytes: KV pool memory when ``num_pages`` is ``None`` (bytes).
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
        max_num_seqs: most requests running at once.
        max_model_len: longest sequence (prompt + output, tokens); ``None`` takes the
            model's context length (``ModelConfig.context_length``), capped by the pool's
            capacity. A larger value than the model's is refused unless
            ``allow_long_context``.
        allow_long_context: accept ``max_model_len`` above the model's context length
            (logs a warning; output quality past it is not guaranteed).
        enable_prefix_caching: reuse published pages across requests.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        dtype: a name or alias in :data:`DTYPES`; stored as its canonical name
            (``"float32"``, ``"bfloat16"``, ``"float16"``); ``torch_dtype`` is the resolved one.
        quantization: how linear weights are held, one of :data:`QUANTIZATION_MODES`:
            ``auto`` keeps a GGUF file's quantized layout (others float), ``none`` float in
            ``dtype``, ``int4``/``int8`` weight-only codes per 32 input columns
            (:mod:`prefixcache.model.quantize`).
        kv_cache_dtype: the KV pool's storage, one of :data:`KV_CACHE_DTYPES` (a float
            alias of :data:`DTYPES` is stored as its canonical name): ``auto`` follows
            ``dtype``; ``int8`` holds 8-bit codes with a float32 scale per token and KV
            head (:mod:`prefixcache.model.kv_pool`). A byte budget (``kv_cache_bytes``)
            holds 2x the pages in bfloat16 and about 3.8x in int8 of float32's. Part of
            the model fingerprint: pools of different KV dtypes never share a page.
        compute_backend: the model's compute backend, chosen once at load (one of
            :data:`COMPUTE_BACKENDS`; ``cpu`` and ``cpu-kernels`` need a CPU ``device``).
        deterministic: batch-invariant arithmetic; cold and warm runs are bit-identical.
        seed: seed of the engine's generator (unseeded sampling).
        shuffle_seed: start the page free list shuffled (non-contiguous pages; tests).
        cache_aware_window_s: how much earlier (seconds) a request whose whole prompt is
            cached counts as having arrived, when ordering the waiting queue. A cold
            request is passed only by requests that arrived less than this after it,
            which bounds its extra wait (aging). ``0`` gives first-come-first-served.
        hash_root_seed: root seed of page hashes; defaults to ``$PREFIXCACHE_HASH_SEED``
            or :data:`DEFAULT_HASH_ROOT_SEED`, read when the config is built, so the
            config alone determines the cache keys.
        max_waiting_requests: admission limit of the waiting queue (server answers
            429 beyond it); ``None`` for unbounded.
        num_threads: torch intra-op threads, set process-wide when the engine is built;
            ``None`` leaves torch's setting alone (no global side effect).
        max_pinned_fraction: cap on pinned pages (TTL pins), a share of the pool in
            ``[0, 1]``; ``0`` disables pinning (``prefixcache/cache/pins.py``).
        session_ttl_s: how long an agent session's transcript stays ahead of LRU after
            each call (seconds, under the pin cap); ``0`` keeps nothing
            (``prefixcache/cache/sessions.py``).
        tenant_quota_fraction: every tenant's quota, a share of the pool in ``(0, 1]``:
            a tenant over it evicts its own cached pages first; ``None`` for no quota
            (``prefixcache/cache/quotas.py``).
        tenant_quotas: per-tenant shares overriding ``tenant_quota_fraction`` (the
            server fills it from the key file).
        kv_events_endpoint: ZeroMQ address the engine binds to publish KV events
            (vLLM's schema, ``engine/kv_events.py``), e.g. ``tcp://127.0.0.1:5557``;
            ``None`` publishes nothing.
        kv_events_replay_endpoint: ZeroMQ address of the replay socket (needs
            ``kv_events_endpoint``); ``None`` for no replay.
        kv_store_url: the shared KV tier (L4), ``redis://HOST:PORT/DB`` (Redis or
            Valkey); ``None`` for none (flag ``--kv-store``).
        kv_store_ttl_s: lifetime of a page in the shared tier, seconds.
        kv_store_timeout_s: time budget of every call to the shared tier, seconds.
        kv_store_lock_wait_s: longest a request waits for another replica computing
            the same cold prefix, seconds; ``0`` never waits.
        host_cache_bytes: byte budget of the host-RAM KV tier (L2); ``0`` turns it off;
            at most the physical RAM, and (checked by the engine) at least one KV page.
        disk_cache_dir: directory of the disk KV tier (L3); ``None`` turns it off.
        disk_cache_bytes: byte budget of the disk tier (bytes of its files); other than
            the default only with ``disk_cache_dir``; at least one KV page (the engine).
        tier_write_policy: ``"write_back"`` (pages are written down when evicted from
            the pool) or ``"write_through"`` (pages are written down when they are hit).
        tier_load_policy: ``"auto"`` (load a tier hit only when loading is estimated to
            beat recomputing) or ``"always"``.
        tier_store_queue: bound of the asynchronous store queue (page groups); a store
            beyond it is dropped and counted.

    Raises:
        ValueError: a field out of range; the message starts with the field's name.
    """

    model: str = field(default="builtin:tiny", metadata=_opt(
        "a Hugging Face model directory, a .gguf file (or a directory holding one), "
        "a registered name (smollm2-135m-instruct-q4_1), a Hugging Face hub id "
        "(Qwen/Qwen3-0.6B, org/name-GGUF:Q4_K_M), or builtin:tiny"))
    revision: str | None = field(default=None, metadata=_opt(
        "hub revision (branch, tag or commit) of a hub id --model", default="main"))
    block_size: int = field(default=16, metadata=_opt("KV page size", "tokens"))
    num_pages: int | None = field(default=None, metadata=_opt(
        "KV pool size", "pages", default="from --kv-cache-gib"))
    kv_cache_bytes: int = field(default=DEFAULT_KV_CACHE_BYTES, metadata=_opt(
        "KV pool memory when --num-pages is not given", "bytes"))
    max_num_batched_tokens: int = field(default=2048, metadata=_opt(
        "token budget of one step (prefill chunks + decodes)", "tokens"))
    max_num_seqs: int = field(default=64, metadata=_opt("most requests running at once",
                                                        "requests"))
    max_model_len: int | None = field(default=None, metadata=_opt(
        "longest prompt + output", "tokens", default="the model's context length"))
    allow_long_context: bool = field(default=False, metadata=_opt(
        "accept --max-model-len above the model's context length (logs a warning)"))
    enable_prefix_caching: bool = field(default=True, metadata=_opt(
        "reuse published KV pages across requests"))
    device: str = field(default="cpu", metadata=_opt("cpu, cuda or cuda:N"))
    dtype: str = field(default="float32", metadata=_opt(
        "weights and KV dtype: " + ", ".join(DTYPES)))
    quantization: str = field(default="auto", metadata=_opt(
        "linear weights: auto (a GGUF file stays quantized), none (float), int4 or int8 "
        "(weight-only, group size 32)"))
    kv_cache_dtype: str = field(default="auto", metadata=_opt(
        "KV cache storage: auto (the weights' --dtype), float32, bfloat16 or int8 "
        "(8-bit codes, a float32 scale per token and KV head)"))
    compute_backend: str = field(default="auto", metadata=_opt(
        "the model's compute backend, chosen once at load: " + ", ".join(COMPUTE_BACKENDS)
        + " (auto: torch off the CPU; on the CPU, the C++ kernels where the CPU has "
        "AVX-512F)"))
    deterministic: bool = field(default=False, metadata=_opt(
        "batch-invariant arithmetic: cold and warm runs are bit-identical"))
    seed: int = field(default=0, metadata=_opt("seed of the engine's generator "
                                               "(requests without their own seed)"))
    shuffle_seed: int | None = field(default=None, metadata=_opt(
        "start the page free list shuffled (tests)", cli=False))
    cache_aware_window_s: float = field(default=0.5, metadata=_opt(
        "head start of a fully cached request in the waiting queue (0: FCFS)", "seconds"))
    hash_root_seed: str = field(default_factory=hash_root_seed_from_env, metadata=_opt(
        "page-hash root seed (prefer the environment variable: flags show in ps)",
        default=f"${HASH_SEED_ENV}, else {DEFAULT_HASH_ROOT_SEED!r}"))
    max_waiting_requests: int | None = field(default=None, metadata=_opt(
        "waiting-queue limit; beyond it the server answers 429", "requests",
        default="unbounded"))
    num_threads: int | None = field(default=None, metadata=_opt(
        "torch intra-op CPU threads, set process-wide", "threads",
        default="torch's own setting"))
    kv_events_endpoint: str | None = field(default=None, metadata=_opt(
        "ZeroMQ address to bind for KV events (vLLM schema), e.g. tcp://127.0.0.1:5557",
        default="no events"))
    kv_events_replay_endpoint: str | None = field(default=None, metadata=_opt(
        "ZeroMQ address to bind for KV event replay (needs --kv-events-endpoint)",
        default="no replay"))
    kv_store_url: str | None = field(default=None, metadata=_opt(
        "shared KV tier (L4): redis://HOST:PORT/DB (Redis or Valkey)", default="none",
        flag="--kv-store"))
    kv_store_ttl_s: float = field(default=3600.0, metadata=_opt(
        "lifetime of a page in the shared KV tier", "seconds"))
    kv_store_timeout_s: float = field(default=0.1, metadata=_opt(
        "time budget of every call to the shared KV tier", "seconds"))
    kv_store_lock_wait_s: float = field(default=2.0, metadata=_opt(
        "longest wait for another replica computing the same cold prefix (0: never)",
        "seconds"))

    host_cache_bytes: int = field(default=0, metadata=_opt(
        "host-RAM KV tier (L2) budget, 0 for none", "bytes"))
    disk_cache_dir: str | None = field(default=None, metadata=_opt(
        "directory of the disk KV tier (L3)", default="none (no disk tier)"))
    disk_cache_bytes: int = field(default=DEFAULT_DISK_CACHE_BYTES, metadata=_opt(
        "disk KV tier (L3) budget", "bytes"))
    tier_write_policy: str = field(default="write_back", metadata=_opt(
        "when pages are written to the KV tiers: write_back (on eviction) or "
        "write_through (when hit)"))
    tier_load_policy: str = field(default="auto", metadata=_opt(
        "auto (load a tier hit only when estimated faster than recompute) or always"))
    tier_store_queue: int = field(default=16, metadata=_opt(
        "bound of the KV tier store queue; stores beyond it are dropped", "page groups"))

    max_pinned_fraction: float = field(default=0.5, metadata=_opt(
        "most pinned (TTL) pages, as a share of the KV pool; 0 disables pinning", "share"))
    session_ttl_s: float = field(default=300.0, metadata=_opt(
        "how long an agent session's transcript is kept ahead of LRU after each call "
        "(the tool-pause budget); 0 keeps nothing", "seconds"))
    tenant_quota_fraction: float | None = field(default=None, metadata=_opt(
        "each tenant's share of the KV pool: over it, a tenant evicts its own cached pages "
        "first", "share", default="no quota"))
    tenant_quotas: dict[str, float] | None = field(default=None, metadata=_opt(
        "per-tenant quota shares (the server reads them from the key file)", cli=False))

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
        self.dtype = dtype_name(self.dtype)
        need(self.quantization in QUANTIZATION_MODES, "quantization",
             f"must be one of {', '.join(QUANTIZATION_MODES)}, got {self.quantization!r}")
        if isinstance(self.kv_cache_dtype, str) and self.kv_cache_dtype.lower() in DTYPES:
            self.kv_cache_dtype = dtype_name(self.kv_cache_dtype)
        need(self.kv_cache_dtype in KV_CACHE_DTYPES, "kv_cache_dtype",
             f"must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        need(self.compute_backend in COMPUTE_BACKENDS, "compute_backend",
             f"must be one of {', '.join(COMPUTE_BACKENDS)}, got {self.compute_backend!r}")
        need(self.cache_aware_window_s >= 0, "cache_aware_window_s", "must be >= 0")
        need(self.max_waiting_requests is None or self.max_waiting_requests >= 1,
             "max_waiting_requests", f"must be >= 1 (0 would refuse every request), got "
             f"{self.max_waiting_requests}")
        need(self.num_threads is None or self.num_threads >= 1, "num_threads",
             f"must be >= 1, got {self.num_threads}")
        need(0.0 <= self.max_pinned_fraction <= 1.0, "max_pinned_fraction",
             f"must be in [0, 1], got {self.max_pinned_fraction}")
        need(0.0 <= self.session_ttl_s <= 7 * 24 * 3600.0, "session_ttl_s",
             f"must be from 0 to 604800 seconds, got {self.session_ttl_s}")
        for name, f in [("tenant_quota_fraction", self.tenant_quota_fraction)] + [
                (f"tenant_quotas[{t!r}]", f) for t, f in (self.tenant_quotas or {}).items()]:
            need(f is None or 0.0 < f <= 1.0, name, f"must be in (0, 1], got {f}")
        need(self.host_cache_bytes >= 0, "host_cache_bytes", "must be >= 0")
        ram_excess = over_physical_ram(self.host_cache_bytes, f"{self.host_cache_bytes} bytes")
        need(ram_excess is None, "host_cache_bytes", str(ram_excess))
        need(self.disk_cache_bytes >= 1, "disk_cache_bytes", "must be >= 1")
        need(self.disk_cache_dir is not None
             or self.disk_cache_bytes == DEFAULT_DISK_CACHE_BYTES, "disk_cache_bytes",
             "needs disk_cache_dir (no disk tier without a directory)")
        need(self.disk_cache_dir is None or bool(self.disk_cache_dir), "disk_cache_dir",
             "must be a non-empty path or None")
        need(self.tier_write_policy in ("write_back", "write_through"), "tier_write_policy",
             f"must be write_back or write_through, got {self.tier_write_policy!r}")
        need(self.tier_load_policy in ("auto", "always"), "tier_load_policy",
             f"must be auto or always, got {self.tier_load_policy!r}")
        need(self.tier_store_queue >= 1, "tier_store_queue", "must be >= 1")
        need(isinstance(self.hash_root_seed, str) and bool(self.hash_root_seed),
             "hash_root_seed", "must be a non-empty string")
        try:
            dev = torch.device(self.device)
        except RuntimeError as exc:
            raise ValueError(f"device: {exc}") from None
        need(dev.type in ("cpu", "cuda"), "device",
             f"must be cpu, cuda or cuda:N, got {self.device!r}")
        need(dev.type != "cuda" or torch.cuda.is_available(), "device",
             f"{self.device!r} asked for, but this torch build or machine has no CUDA")
        need(dev.type == "cpu" or self.compute_backend in ("auto", "torch"), "compute_backend",
             f"{self.compute_backend!r} runs on the CPU only, not on {self.device!r}")
        need(self.kv_store_ttl_s > 0, "kv_store_ttl_s", f"must be > 0, got {self.kv_store_ttl_s}")
        need(self.kv_store_timeout_s > 0, "kv_store_timeout_s",
             f"must be > 0, got {self.kv_store_timeout_s}")
        need(self.kv_store_lock_wait_s >= 0, "kv_store_lock_wait_s",
             f"must be >= 0, got {self.kv_store_lock_wait_s}")
        need(self.kv_store_url is None or self.kv_store_url.startswith(
            ("redis://", "rediss://", "unix://", "valkey://")), "kv_store_url",
             f"must be redis://HOST:PORT/DB, got {self.kv_store_url!r}")
        need(self.kv_events_replay_endpoint is None or bool(self.kv_events_endpoint),
             "kv_events_replay_endpoint", "needs kv_events_endpoint")
        need(-(1 << 63) <= self.seed < (1 << 64), "seed",
             f"must fit in 64 bits, got {self.seed}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """``dtype`` resolved through :data:`DTYPES` (the one resolution of the setting)."""
        return DTYPES[self.dtype]

    @property
    def kv_dtype(self) -> str:
        """The KV pool's dtype name: ``kv_cache_dtype``, or ``dtype`` when ``auto``."""
        return self.dtype if self.kv_cache_dtype == "auto" else self.kv_cache_dtype

    @property
    def kv_torch_dtype(self) -> torch.dtype:
        """The KV pool's storage dtype (``torch.int8`` for ``int8``)."""
        return torch.int8 if self.kv_dtype == "int8" else DTYPES[self.kv_dtype]
