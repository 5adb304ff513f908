"""Read a GGUF file (llama.cpp's format) in Hugging Face terms: its ``config.json``, its
tensors under HF names, dequantized to float32, and its tokenizer.

Supported: the ``llama`` architecture (Llama, and Mistral, which llama.cpp writes as
``llama`` and names in ``general.name``) and ``qwen2``; tensor types in
:data:`SUPPORTED_TYPES`. llama.cpp's converter permutes the rows of the Llama Q and K
projections (interleaved RoPE pairs, per head); :func:`unpermute_qk` undoes it. Qwen2 files
are not permuted. Reading uses the ``gguf`` package (``GGUFReader``,
``gguf.quants.dequantize``); the tokenizer is built by transformers from the metadata.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from prefixcache.model.config import MODEL_TYPES

# Our architectures are config.py's model types (Mistral is a "llama" file plus its
# name); GGUF writes these two.
GGUF_ARCHITECTURES = ("llama", "qwen2")
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                   "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")

_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}


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
                         "llama, mistral (as llama), qwen2")
    if arch == "llama" and "mistral" in str(field(reader, "general.name", "")).lower():
        return "mistral"
    return arch


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
    if ours == "qwen2":
        cfg["use_sliding_window"] = False
    return cfg


def _eos_ids(reader) -> list[int]:
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id")
    ids = [int(v) for v in (field(reader, k) for k in keys) if v is not None]
    return sorted(set(ids))


def hf_name(name: str) -> str:
    """The HF name of GGUF tensor ``name``.

    Raises:
        ValueError: a tensor name we do not know (named).
    """
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    parts = name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
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


def hf_tensors(reader, config: dict[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """``(HF name, float32 array)`` for every tensor the model uses, Q/K un-permuted for
    Llama and Mistral files. Call :func:`check_supported` first."""
    permuted = config["model_type"] in ("llama", "mistral")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = dequantize(t)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if permuted and kind in heads:
            w = unpermute_qk(w, heads[kind])
        yield name, w


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
