"""Model hyper-parameters, parsed from a Hugging Face ``config.json``.

Supported architectures (:data:`MODEL_TYPES`): ``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``Phi3ForCausalLM`` (Phi-3, Phi-4-mini) and
``Gemma3ForCausalLM`` (Gemma 3 text). All are one decoder (RMSNorm, GQA attention with
RoPE, gated MLP) with per-family switches: q/k RMSNorm per head (Qwen3, Gemma 3), the
Gemma norms ``(1 + w)`` (folded into the weights at load), norms after attention and
after the MLP, embeddings scaled by ``sqrt(hidden)``, ``gelu_pytorch_tanh``, a query scale
of ``query_pre_attn_scalar ** -0.5``, final logit soft-capping, a second RoPE base for
the sliding layers (Gemma 3), LongRoPE short/long factors and partial rotary (Phi). A
file whose ``architectures`` is empty or missing is read by its ``model_type``, as
transformers does. Both config generations are read:
transformers 5 writes ``rope_parameters``; older files write ``rope_theta`` plus
``rope_scaling``. The model's context length (:attr:`ModelConfig.context_length`) is
derived here, and :meth:`ModelConfig.check_max_model_len` refuses a longer one.
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# config.json ``model_type`` -> architecture (also used when ``architectures`` is empty
# or missing, and by the GGUF reader)
MODEL_TYPES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
               "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
               "phi3": "Phi3ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
SUPPORTED_ARCHITECTURES = tuple(MODEL_TYPES.values())
# tokenizer_config.json values at or above this mean "no limit" (transformers writes 1e30)
_UNBOUNDED_MODEL_MAX_LENGTH = 1 << 40

log = logging.getLogger(__name__)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "longrope")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")


@dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling.

    Attributes:
        rope_type: ``"default"`` (none), ``"linear"`` (positions divided by ``factor``),
            ``"llama3"`` (Llama 3.1 wavelength-dependent scaling) or ``"longrope"``
            (Phi-3 / Phi-4-mini; older files say ``"su"``).
        factor: scaling factor (1.0 for ``default``).
        low_freq_factor, high_freq_factor: ``llama3`` only.
        original_max_position_embeddings: ``llama3`` and ``longrope``.
        short_factor, long_factor: ``longrope``: per rotary frequency divisors for
            positions below ``original_max_position_embeddings`` and from it on.
        attention_factor: ``longrope``: cos and sin are multiplied by it.
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    attention_factor: float = 1.0


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of a Llama-family decoder.

    Attributes:
        architecture: the Hugging Face class name, e.g. ``"LlamaForCausalLM"``.
        hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
        num_key_value_heads, head_dim, vocab_size: geometry, Hugging Face names
            (``head_dim`` may differ from ``hidden_size // num_attention_heads``).
        rms_norm_eps: RMSNorm epsilon.
        rope_theta: RoPE base; ``rope_scaling``: see :class:`RopeScaling`.
        max_position_embeddings: the config's ``max_position_embeddings`` (GGUF:
            ``context_length``), tokens.
        model_max_length: the tokenizer's ``model_max_length`` (``tokenizer_config.json``),
            tokens, or ``None`` when absent or unbounded.
        tie_word_embeddings: ``lm_head`` shares the embedding matrix.
        qkv_bias: q/k/v projections have a bias (Qwen2, Llama ``attention_bias``).
        o_bias: output projection has a bias (Llama ``attention_bias``; never Qwen2).
        mlp_bias: gate/up/down projections have a bias (Llama ``mlp_bias``).
        layer_sliding_windows: per layer, the attention window in tokens, or ``None``
            for full attention. A query at position ``p`` sees keys ``(p - window, p]``.
            The model implements the window exactly (it keeps all KV and masks).
        bos_token_id: or ``None``. ``eos_token_ids``: every id that ends generation.
        torch_dtype: the checkpoint's dtype name (``"bfloat16"``...) or ``None``.
        hidden_act: ``"silu"`` or ``"gelu_pytorch_tanh"`` (the MLP's gate activation).
        qk_norm: RMSNorm over each head of q and k before RoPE (Qwen3, Gemma 3).
        sandwich_norms: RMSNorm of the attention output and of the MLP output before
            each residual add (Gemma 3: ``post_attention_layernorm`` and
            ``post_feedforward_layernorm``; the MLP's input norm is then
            ``pre_feedforward_layernorm``).
        norm_weight_offset: added to every norm weight at load (Gemma's ``1 + w``).
        embed_scale: the embeddings are multiplied by it (Gemma: ``sqrt(hidden)``).
        query_scale: attention scores' scale, or ``None`` for ``head_dim ** -0.5``
            (Gemma 3: ``query_pre_attn_scalar ** -0.5``).
        final_logit_softcapping: logits ``c * tanh(logits / c)``, or ``None``.
        rotary_dim: leading dimensions of a head that RoPE rotates (Phi-4-mini's
            ``partial_rotary_factor``), ``head_dim`` when all.
        local_rope_theta: RoPE base of the sliding-window layers (Gemma 3's local base,
            unscaled), or ``None`` when every layer uses ``rope_theta``/``rope_scaling``.
    """

    architecture: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    layer_sliding_windows: tuple[int | None, ...] = ()
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    model_max_length: int | None = None
    hidden_act: str = "silu"
    qk_norm: bool = False
    sandwich_norms: bool = False
    norm_weight_offset: float = 0.0
    embed_scale: float | None = None
    query_scale: float | None = None
    final_logit_softcapping: float | None = None
    rotary_dim: int = 0
    local_rope_theta: float | None = None

    def __post_init__(self) -> None:
        if not self.rotary_dim:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary_dim ({self.rotary_dim}) must be even and at most "
                             f"head_dim ({self.head_dim})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a "
                             f"multiple of num_key_value_heads ({self.num_key_value_heads})")
        if not self.layer_sliding_windows:
            object.__setattr__(self, "layer_sliding_windows", (None,) * self.num_hidden_layers)
        if len(self.layer_sliding_windows) != self.num_hidden_layers:
            raise ValueError("layer_sliding_windows needs one entry per layer")

    @property
    def sliding_window(self) -> int | None:
        """The narrowest attention window, tokens, if any layer's window is smaller than
        ``max_position_embeddings`` (so it can matter); else ``None``. Prefix caching
        stays exact with windows: see :meth:`pages_for_global_layers_only` for the rule."""
        windows = [w for w in self.layer_sliding_windows if w is not None]
        return min(windows) if windows else None

    def pages_for_global_layers_only(self, num_tokens: int, block_size: int) -> int:
        """Leading full pages of a sequence of ``num_tokens`` computed tokens that no
        sliding-window layer reads any more (its next query, at position ``num_tokens``,
        sees keys ``> num_tokens - window`` under the widest window) but a global layer
        still does: 0 unless the model interleaves sliding and global layers.

        The sliding-window cache rule lives here and in the pool's layout: a page holds
        the KV of every layer, and neither a running request's page table nor the prefix
        index drops a page because the sliding layers stopped reading it. So a published
        page is readable by every layer, a prefix hit gives each layer all it needs (the
        global layers the whole prefix, the sliding ones their window), and outputs are
        exact. The engine reports the sum over running requests as
        ``pages_kept_for_global_layers`` (what keeping full KV costs over a windowed pool).
        """
        windows = [w for w in self.layer_sliding_windows if w is not None]
        if not windows or len(windows) == len(self.layer_sliding_windows):
            return 0
        return max(0, (num_tokens - max(windows) + 1) // block_size)

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def context_length(self) -> int:
        """The longest sequence the model supports, tokens, derived as vLLM does:
        ``max_position_embeddings``, times ``factor`` under ``linear`` RoPE scaling (whose
        checkpoints state the unscaled length; ``llama3`` files already state the scaled
        one), capped by the tokenizer's ``model_max_length``. A sliding window does not
        shorten it: the model keeps all KV and masks the window exactly."""
        length = self.max_position_embeddings
        if self.rope_scaling.rope_type == "linear":
            length = int(length * self.rope_scaling.factor)
        if self.model_max_length is not None:
            length = min(length, self.model_max_length)
        return length

    def check_max_model_len(self, max_model_len: int | None,
                            allow_long_context: bool = False) -> int:
        """The context length to run with, tokens: ``max_model_len``, or
        :attr:`context_length` when it is ``None``.

        Raises:
            ValueError: ``max_model_len`` exceeds :attr:`context_length` and
                ``allow_long_context`` is false (the message names both numbers). With
                ``allow_long_context`` the value is kept and a warning is logged.
        """
        limit = self.context_length
        if max_model_len is None:
            return limit
        if max_model_len > limit:
            msg = (f"max_model_len: {max_model_len} tokens is longer than the model's context "
                   f"length of {limit} tokens ({self._context_source()})")
            if not allow_long_context:
                raise ValueError(f"{msg}; pass allow_long_context=True "
                                 "(--allow-long-context) to run past it anyway")
            log.warning("%s; allow_long_context is set, so output past %d tokens may be "
                        "degraded", msg, limit)
        return max_model_len

    def _context_source(self) -> str:
        if self.model_max_length is not None and self.model_max_length == self.context_length:
            return "the tokenizer's model_max_length"
        if self.rope_scaling.rope_type == "linear":
            return (f"max_position_embeddings {self.max_position_embeddings} x linear RoPE "
                    f"factor {self.rope_scaling.factor:g}")
        return "max_position_embeddings"

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        """Parse a ``config.json`` dictionary.

        Raises:
            ValueError: unsupported architecture, activation or RoPE type, or a missing
                required key (the message names the key).
        """
        arch = _architecture(cfg)
        is_gemma = arch == "Gemma3ForCausalLM"
        act_key = "hidden_activation" if is_gemma and "hidden_activation" in cfg else "hidden_act"
        act = cfg.get(act_key) or ("gelu_pytorch_tanh" if is_gemma else "silu")
        if act not in SUPPORTED_ACTIVATIONS:
            raise ValueError(f"config.json {act_key!r} is {act!r}; supported: "
                             f"{', '.join(SUPPORTED_ACTIVATIONS)}")
        if cfg.get("attn_logit_softcapping") is not None:
            raise ValueError("config.json 'attn_logit_softcapping' is "
                             f"{cfg['attn_logit_softcapping']!r}; attention soft-capping is not "
                             "supported (null is)")
        if cfg.get("use_bidirectional_attention"):
            raise ValueError("config.json 'use_bidirectional_attention' is true; only causal "
                             "attention is supported")

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ValueError(f"config.json lacks required key {key!r}")
            return cfg[key]

        hidden, heads = need("hidden_size"), need("num_attention_heads")
        layers = need("num_hidden_layers")
        head_dim = cfg.get("head_dim") or hidden // heads
        theta, scaling, local_theta = _parse_rope(cfg, arch, head_dim)
        attn_bias = bool(cfg.get("attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        max_pos = int(cfg.get("max_position_embeddings", 2048))
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            vocab_size=need("vocab_size"),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=True if is_qwen2 else attn_bias,
            o_bias=False if is_qwen2 else attn_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            layer_sliding_windows=_parse_windows(cfg, arch, layers, max_pos),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=cfg.get("dtype") or cfg.get("torch_dtype"),
            hidden_act=act,
            qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"),
            sandwich_norms=is_gemma,
            norm_weight_offset=1.0 if is_gemma else 0.0,
            embed_scale=float(hidden) ** 0.5 if is_gemma else None,
            query_scale=(float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5
                         if is_gemma else None),
            final_logit_softcapping=(float(cfg["final_logit_softcapping"])
                                     if cfg.get("final_logit_softcapping") is not None
                                     else None),
            rotary_dim=_rotary_dim(cfg, head_dim),
            local_rope_theta=local_theta,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Read and parse a ``config.json``. Raises FileNotFoundError or ValueError."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"model config not found: {path}")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(cfg)

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read a model directory's ``config.json``, and ``model_max_length`` from its
        ``tokenizer_config.json`` when there is one. Raises FileNotFoundError or ValueError."""
        path = Path(path)
        config = cls.from_file(path / "config.json")
        tok_file = path / "tokenizer_config.json"
        if not tok_file.is_file():
            return config
        try:
            limit = json.loads(tok_file.read_text()).get("model_max_length")
        except (json.JSONDecodeError, AttributeError) as e:
            raise ValueError(f"{tok_file} is not a JSON object: {e}") from e
        if isinstance(limit, (int, float)) and 0 < limit < _UNBOUNDED_MODEL_MAX_LENGTH:
            return replace(config, model_max_length=int(limit))
        return config


def _architecture(cfg: dict[str, Any]) -> str:
    """The supported architecture named by ``architectures``, else by ``model_type``."""
    archs = cfg.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None and not archs:
        arch = MODEL_TYPES.get(cfg.get("model_type") or "")
    if arch is None:
        raise ValueError(f"config.json 'architectures' is {archs!r} and 'model_type' is "
                         f"{cfg.get('model_type')!r}; supported: "
                         f"{', '.join(SUPPORTED_ARCHITECTURES)} "
                         f"(model_type {', '.join(MODEL_TYPES)})")
    return arch


def _rotary_dim(cfg: dict[str, Any], head_dim: int) -> int:
    """Rotated dimensions per head: ``partial_rotary_factor`` (top level, or inside
    ``rope_parameters``) times ``head_dim``."""
    params = cfg.get("rope_parameters") if isinstance(cfg.get("rope_parameters"), dict) else {}
    factor = cfg.get("partial_rotary_factor", (params or {}).get("partial_rotary_factor", 1.0))
    return int(head_dim * float(factor))


def _parse_rope(cfg: dict[str, Any], arch: str = "", head_dim: int = 0
                ) -> tuple[float, RopeScaling, float | None]:
    """RoPE base and scaling from either ``rope_parameters`` (transformers 5) or
    ``rope_theta`` + ``rope_scaling`` (older files), and Gemma 3's base for its sliding
    layers (``None`` for other families). Gemma 3's ``rope_parameters`` is keyed by layer
    type (``full_attention``, ``sliding_attention``); older Gemma 3 files give
    ``rope_local_base_freq``."""
    if arch == "Gemma3ForCausalLM":
        rp = cfg.get("rope_parameters")
        if isinstance(rp, dict) and "full_attention" in rp:
            local = dict(rp.get("sliding_attention") or {})
            if local.get("rope_type", "default") != "default":
                raise ValueError("config.json 'rope_parameters.sliding_attention.rope_type' "
                                 f"is {local['rope_type']!r}; supported: default")
            theta, scaling = _parse_rope_params(
                "rope_parameters.full_attention",
                {"rope_theta": 1_000_000.0, **(rp["full_attention"] or {})}, cfg, head_dim)
            return theta, scaling, float(local.get("rope_theta", 10_000.0))
        cfg = {"rope_theta": 1_000_000.0, **cfg}
        theta, scaling = _parse_rope_params(*_rope_source(cfg), cfg, head_dim)
        return theta, scaling, float(cfg.get("rope_local_base_freq", 10_000.0))
    theta, scaling = _parse_rope_params(*_rope_source(cfg), cfg, head_dim)
    return theta, scaling, None


def _rope_source(cfg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    if isinstance(cfg.get("rope_parameters"), dict):
        return "rope_parameters", dict(cfg["rope_parameters"])
    return "rope_scaling", dict(cfg.get("rope_scaling") or {})


def _parse_rope_params(key: str, params: dict[str, Any], cfg: dict[str, Any], head_dim: int
                       ) -> tuple[float, RopeScaling]:
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "su":  # the name of LongRoPE in early Phi-3 files
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"config.json '{key}.rope_type' is {rope_type!r}; supported: "
                         f"{', '.join(SUPPORTED_ROPE_TYPES)}")
    if rope_type == "default":
        return theta, RopeScaling()
    if rope_type == "longrope":
        return theta, _longrope(key, params, cfg, head_dim)
    if "factor" not in params:
        raise ValueError(f"config.json '{key}' of type {rope_type!r} lacks 'factor'")
    if rope_type == "linear":
        return theta, RopeScaling("linear", float(params["factor"]))
    return theta, RopeScaling(
        "llama3",
        float(params["factor"]),
        float(params.get("low_freq_factor", 1.0)),
        float(params.get("high_freq_factor", 4.0)),
        int(params.get("original_max_position_embeddings",
                       cfg.get("max_position_embeddings", 8192))),
    )


def _longrope(key: str, params: dict[str, Any], cfg: dict[str, Any], head_dim: int
              ) -> RopeScaling:
    """LongRoPE as transformers computes it: ``factor`` defaults to
    ``max_position_embeddings / original_max_position_embeddings``, ``attention_factor``
    to ``sqrt(1 + ln(factor) / ln(original))`` (1 when ``factor <= 1``)."""
    original = params.get("original_max_position_embeddings",
                          cfg.get("original_max_position_embeddings"))
    if original is None:
        raise ValueError(f"config.json '{key}' of type 'longrope' lacks "
                         "'original_max_position_embeddings'")
    original = int(original)
    half = _rotary_dim(cfg, head_dim) // 2
    factors = {}
    for name in ("short_factor", "long_factor"):
        values = params.get(name)
        if not isinstance(values, list) or len(values) != half:
            raise ValueError(f"config.json '{key}.{name}' must be a list of {half} numbers "
                             "(one per rotary frequency)")
        factors[name] = tuple(float(v) for v in values)
    factor = params.get("factor")
    factor = (float(factor) if factor is not None
              else int(cfg.get("max_position_embeddings", original)) / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = (1.0 if factor <= 1.0
                     else math.sqrt(1 + math.log(factor) / math.log(original)))
    return RopeScaling("longrope", factor, original_max_position_embeddings=original,
                       short_factor=factors["short_factor"],
                       long_factor=factors["long_factor"],
                       attention_factor=float(attention))


def _parse_windows(cfg: dict[str, Any], arch: str, layers: int, max_pos: int
                   ) -> tuple[int | None, ...]:
    """Per-layer sliding window; ``None`` where attention is full (or the window is at
    least ``max_position_embeddings``, so it never applies)."""
    window = cfg.get("sliding_window")
    qwen = arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM")
    if qwen and not cfg.get("use_sliding_window", False):
        window = None
    if window is None or window >= max_pos:
        return (None,) * layers
    if cfg.get("layer_types"):
        types = cfg["layer_types"]
        return tuple(window if t == "sliding_attention" else None for t in types)
    if qwen:
        first = int(cfg.get("max_window_layers", layers))
        return tuple(window if i >= first else None for i in range(layers))
    return (window,) * layers
