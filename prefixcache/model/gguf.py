"""Read a GGUF file (llama.cpp's format) in Hugging Face terms: its ``config.json``, its
tensors under HF names, dequantized to float32, and its tokenizer.

Supported: the ``llama`` architecture (Llama, and Mistral, which llama.cpp writes as
``llama`` and names in ``general.name``), ``qwen2``, ``qwen3``, ``gemma3`` and ``phi3``
(Phi-3, Phi-4-mini); tensor types in :data:`SUPPORTED_TYPES`. llama.cpp's converter
permutes the rows of the Llama Q and K projections (interleaved RoPE pairs, per head);
:func:`unpermute_qk` undoes it; the other families are not permuted. As llama.cpp writes
them: Gemma 3 norm weights are stored as ``1 + w`` (read back as ``w``), its sliding
layers are every layer but each sixth (``attention.sliding_window_pattern`` when
present), its local RoPE base is 10000 and its query scale ``key_length ** -0.5``; Phi-3's
``attn_qkv`` and ``ffn_up`` hold q/k/v and gate/up fused, and its LongRoPE factors are the
tensors ``rope_factors_short``/``rope_factors_long``. Reading uses the ``gguf`` package
(``GGUFReader``, ``gguf.quants.dequantize``); the tokenizer is built by transformers from
the metadata.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.model.config import MODEL_TYPES

# GGUF architecture -> our model type (config.py's MODEL_TYPES; Mistral is a "llama" file
# plus its name)
GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "gemma3": "gemma3_text", "phi3": "phi3"}
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_q_norm": "self_attn.q_norm",
                "attn_k_norm": "self_attn.k_norm", "attn_qkv": "self_attn.qkv_proj"}
# per architecture, where it differs from _LAYER_NAMES
_ARCH_LAYER_NAMES = {
    "gemma3": {"ffn_norm": "pre_feedforward_layernorm",
               "post_attention_norm": "post_attention_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
}
# tensors read into the config, not weights
ROPE_FACTOR_TENSORS = ("rope_factors_short.weight", "rope_factors_long.weight")


def open_reader(path: str | Path):
    """A ``gguf.GGUFReader`` over ``path`` (memory-mapped).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, or truncated (the message names the file).
    """
    import gguf

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, OSError) as e:  # bad magic, short file...
        raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def field(reader, key: str, default: Any = None) -> Any:
    """The value of metadata ``key`` (scalar, string or list), or ``default``."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def architecture(reader) -> str:
    """Our model type, a key of :data:`prefixcache.model.config.MODEL_TYPES`
    (``"llama"``, ``"mistral"``, ``"qwen2"``).

    Raises:
        ValueError: ``general.architecture`` is missing or not supported (named).
    """
    arch = field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: "
                         "llama, mistral (as llama), qwen2, qwen3, gemma3, phi3")
    if arch == "llama" and "mistral" in str(field(reader, "general.name", "")).lower():
        return "mistral"
    return GGUF_ARCHITECTURES[arch]


def check_supported(reader) -> None:
    """Check the architecture and every tensor's type before any work is done.

    Raises:
        ValueError: naming the unsupported architecture, or the first tensor whose type
            is not in :data:`SUPPORTED_TYPES` and that type.
    """
    architecture(reader)
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_TYPES:
            raise ValueError(f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which is "
                             f"not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError("GGUF tensor 'rope_freqs.weight' (Llama 3.1 RoPE frequency scaling) "
                         "is not supported; load the Hugging Face directory instead")


def hf_config(reader) -> dict[str, Any]:
    """A Hugging Face ``config.json`` dictionary for the file's model.

    ``max_position_embeddings`` is ``<arch>.context_length``; ``head_dim`` is
    ``<arch>.attention.key_length`` (else ``rope.dimension_count`` for Llama, else
    hidden / heads); ``vocab_size`` is the embedding's row count.

    Raises:
        ValueError: unsupported architecture or RoPE scaling, or a missing required key.
    """
    ours = architecture(reader)
    arch = field(reader, "general.architecture")

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ValueError(f"GGUF metadata lacks required key '{arch}.{key}'")
        return value

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = field(reader, f"{arch}.attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = field(reader, f"{arch}.rope.dimension_count")
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ValueError("GGUF file lacks tensor 'token_embd.weight'")
    cls, model_type = MODEL_TYPES[ours], ours
    cfg: dict[str, Any] = {
        "architectures": [cls], "model_type": model_type, "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(head_dim or hidden // heads),
        "vocab_size": int(embd.shape[1]),
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _eos_ids(reader),
    }
    scaling = field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear",
                               "factor": float(need("rope.scaling.factor"))}
    elif scaling != "none":
        raise ValueError(f"GGUF '{arch}.rope.scaling.type' is {scaling!r}; supported: "
                         "none, linear")
    if ours == "llama":
        cfg["attention_bias"] = "blk.0.attn_output.bias" in names
        cfg["mlp_bias"] = "blk.0.ffn_up.bias" in names
    if ours == "mistral":
        cfg["sliding_window"] = None
    if ours in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
    if ours == "gemma3_text":
        _gemma3_config(reader, cfg)
    if ours == "phi3":
        _phi3_config(reader, cfg, names)
    return cfg


def _gemma3_config(reader, cfg: dict[str, Any]) -> None:
    """Gemma 3's keys, as llama.cpp reads them (see the module doc)."""
    layers = cfg["num_hidden_layers"]
    pattern = field(reader, "gemma3.attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # per layer: true where the layer slides
        types = ["sliding_attention" if p else "full_attention" for p in pattern]
    else:
        types = ["sliding_attention" if (i + 1) % int(pattern) else "full_attention"
                 for i in range(layers)]
    cfg.update(hidden_activation="gelu_pytorch_tanh", layer_types=types,
               sliding_window=field(reader, "gemma3.attention.sliding_window"),
               query_pre_attn_scalar=cfg["head_dim"],
               final_logit_softcapping=field(reader, "gemma3.final_logit_softcapping"),
               rope_local_base_freq=10000.0)
    del cfg["hidden_act"]


def _phi3_config(reader, cfg: dict[str, Any], names: set[str]) -> None:
    """Phi-3's partial rotary, sliding window and LongRoPE (factors from tensors)."""
    rot = field(reader, "phi3.rope.dimension_count")
    if rot is not None:
        cfg["partial_rotary_factor"] = int(rot) / cfg["head_dim"]
    cfg["sliding_window"] = field(reader, "phi3.attention.sliding_window")
    if "rope_factors_long.weight" not in names:
        return
    tensors = {t.name: t for t in reader.tensors}
    original = field(reader, "phi3.rope.scaling.original_context_length")
    if original is None:
        raise ValueError("GGUF metadata lacks required key "
                         "'phi3.rope.scaling.original_context_length'")
    rope = {"rope_type": "longrope", "rope_theta": cfg["rope_theta"],
            "original_max_position_embeddings": int(original),
            "short_factor": dequantize(tensors["rope_factors_short.weight"]).tolist(),
            "long_factor": dequantize(tensors["rope_factors_long.weight"]).tolist()}
    attn = field(reader, "phi3.rope.scaling.attn_factor")
    if attn is not None:
        rope["attention_factor"] = float(attn)
    cfg["rope_scaling"] = rope
    cfg["original_max_position_embeddings"] = int(original)


def _eos_ids(reader) -> list[int]:
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")
    ids = [int(v) for v in (field(reader, k) for k in keys) if v is not None]
    return sorted(set(ids))


def hf_name(name: str, arch: str = "llama") -> str:
    """The HF name of GGUF tensor ``name`` in a file of GGUF architecture ``arch``.

    Raises:
        ValueError: a tensor name we do not know (named).
    """
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    layer_names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    parts = name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    raise ValueError(f"GGUF tensor {name!r} is not part of a supported model")


def unpermute_qk(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: per head, its rows were reordered from
    (half, pair) to (pair, half) so that RoPE rotates adjacent values.

    Args:
        w: ``[num_heads * head_dim, ...]`` (a weight or a bias).
        num_heads: query heads for Q, KV heads for K.
    """
    dim = w.shape[0] // num_heads // 2
    return w.reshape(num_heads, dim, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize(t) -> np.ndarray:
    """float32 array of one ``ReaderTensor``, in PyTorch/HF shape (rows first)."""
    import gguf

    shape = tuple(int(n) for n in reversed(t.shape))
    return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32,
                                                                copy=False).reshape(shape)


def hf_tensor(name: str, w: np.ndarray, arch: str, config: dict[str, Any]) -> np.ndarray:
    """GGUF tensor ``name``'s float values ``w`` (:func:`dequantize`) as its HF tensor:
    Gemma 3 norms read back as ``w`` (llama.cpp stores ``1 + w``), Llama and Mistral Q/K
    rows un-permuted (weights and biases)."""
    if arch == "gemma3" and name.endswith("norm.weight"):
        w = w - 1.0  # llama.cpp stores Gemma's (1 + w)
    kind = name.split(".")[2] if name.startswith("blk.") else ""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    if config["model_type"] in ("llama", "mistral") and kind in heads:
        w = unpermute_qk(w, heads[kind])
    return w


def hf_tensors(reader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """``(HF name, float32 array)`` for every tensor the model uses, Q/K un-permuted for
    Llama and Mistral files (:func:`hf_tensor`). Call :func:`check_supported` first."""
    arch = field(reader, "general.architecture")
    for t in reader.tensors:
        if t.name in ROPE_FACTOR_TENSORS:
            continue  # read into the config's rope_scaling
        yield hf_name(t.name, arch), hf_tensor(t.name, dequantize(t), arch, config)


@dataclass(frozen=True)
class MappedTensor:
    """One tensor of a GGUF file located by :func:`tensor_index` and read through a
    memory map (the file's pages, not a copy): what :func:`dequantize` and
    :mod:`prefixcache.model.gguf_quant` need of a ``ReaderTensor``.

    Attributes:
        name: the GGUF name. tensor_type: its ``gguf.GGMLQuantizationType``.
        shape: GGUF order (columns first). data: F32 and F16 values ``[rows, columns]``
        (a 1-D tensor: ``[columns]``), other types ``uint8 [rows, bytes per row]``.
    """

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    data: np.ndarray


def tensor_index(reader) -> dict[str, Any]:
    """Where every tensor lies in the file (JSON-serializable): ``architecture`` and
    ``tensors``, each ``[name, type name, shape (GGUF order), byte offset, byte count]``.
    Saved once, it lets :func:`mapped_tensors` skip parsing the file's metadata (its
    tokenizer arrays take seconds)."""
    return {"architecture": field(reader, "general.architecture"),
            "tensors": [[t.name, t.tensor_type.name, [int(n) for n in t.shape],
                         int(t.data_offset), int(t.n_bytes)] for t in reader.tensors]}


def mapped_tensors(path: str | Path, index: dict[str, Any]) -> list[MappedTensor]:
    """The tensors of ``index`` (:func:`tensor_index` of this file) as views of one
    read-only memory map of ``path``; the map lives as long as any view.

    Raises:
        ValueError: the index points past the end of the file.
    """
    import gguf

    mm = np.memmap(path, dtype=np.uint8, mode="r")
    out = []
    for name, type_name, shape, offset, nbytes in index["tensors"]:
        if offset + nbytes > mm.shape[0]:
            raise ValueError(f"{path}: tensor {name!r} lies past the end of the file")
        qtype = gguf.GGMLQuantizationType[type_name]
        raw = mm[offset:offset + nbytes]
        rows_first = tuple(reversed(shape))
        if type_name in ("F32", "F16"):  # as GGUFReader gives them (BF16: bytes)
            data = raw.view(np.float32 if type_name == "F32" else np.float16
                            ).reshape(rows_first)
        else:
            data = raw.reshape(gguf.quants.quant_shape_to_byte_shape(rows_first, qtype))
        out.append(MappedTensor(name, qtype, tuple(shape), data))
    return out


def write_tokenizer(reader, gguf_path: str | Path, out_dir: str | Path) -> bool:
    """Build the file's tokenizer with transformers (from ``tokenizer.ggml.*`` metadata and
    ``tokenizer.chat_template``) and save it into ``out_dir`` (``tokenizer.json``,
    ``tokenizer_config.json``, ``chat_template.jinja``). Returns ``False``, writing nothing,
    when the file holds no tokenizer."""
    from transformers import AutoTokenizer

    gguf_path = Path(gguf_path)
    if field(reader, "tokenizer.ggml.model") is None:
        return False
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out_dir))
    return True
