"""GGUF tensors kept quantized: each weight as :class:`~prefixcache.model.quantized_linear.
AffineCodes` (``code * scale + offset`` per 32 input columns) instead of float32.

Exact (the codes, scales and offsets of the file; ``code * scale + offset`` is the value
``gguf.quants.dequantize`` gives, up to float32 rounding): Q4_0, Q4_1 (4 bits), Q5_0, Q5_1,
Q5_K (5 bits), Q8_0 (8 bits), Q4_K (4 bits; its 6-bit sub-block scales and minimums,
multiplied out). Requantized once at load (logged; no 32-column affine form in the file):
Q6_K, Q2_K, Q3_K (sub-blocks of 16) to 8-bit codes by min/max per 32 columns, which adds
at most half a step, ``(max - min) / 510`` per group, to the file's own error; float
matrices (F32, F16, BF16) in a file whose other matrices are quantized likewise (a file
of float matrices only is loaded as float, see ``prefixcache.model.loader``).
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

import prefixcache.model.gguf as gguf
from prefixcache.model.quantized_linear import GROUP, AffineCodes

log = logging.getLogger(__name__)

# type -> (code bits, bytes per block of 32 columns or 256 for K types)
EXACT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K")
REQUANTIZED_BITS = 8


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _scale_offset(type_name: str, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per 32-column group: scale, offset ``[n_groups]`` (float32) and the code width,
    from the blocks' headers (``blocks [n_blocks, block_bytes]`` uint8)."""
    import gguf as gg

    if type_name in ("Q4_0", "Q5_0", "Q8_0"):
        d = _f16(blocks[:, :2])[:, 0]
        bits = {"Q4_0": 4, "Q5_0": 5, "Q8_0": 8}[type_name]
        return d, -d * np.float32(2 ** (bits - 1)), bits
    if type_name in ("Q4_1", "Q5_1"):
        d, m = _f16(blocks[:, :2])[:, 0], _f16(blocks[:, 2:4])[:, 0]
        return d, m, 4 if type_name == "Q4_1" else 5
    # Q4_K / Q5_K: super-block of 256 = 8 sub-blocks of 32, w = d*sc*q - dmin*m
    d, dmin = _f16(blocks[:, :2]), _f16(blocks[:, 2:4])
    sc, mn = gg.quants.Q4_K.get_scale_min(blocks[:, 4:4 + gg.quants.Q4_K.K_SCALE_SIZE])
    scale = (d * sc.astype(np.float32)).reshape(-1)
    offset = -(dmin * mn.astype(np.float32)).reshape(-1)
    return scale, offset, 4 if type_name == "Q4_K" else 5


def affine_codes(t: Any) -> tuple[AffineCodes, bool]:
    """The :class:`AffineCodes` of a 2-D GGUF ``ReaderTensor`` in PyTorch shape
    ``[rows, columns]``, and whether they are the file's own (``False``: requantized to
    8 bits from its float values, see the module doc)."""
    name = t.tensor_type.name
    w = gguf.dequantize(t)  # float32 [rows, cols]: the reference values
    rows, cols = w.shape
    if name not in EXACT_TYPES or cols % GROUP:
        return AffineCodes.from_float(torch.from_numpy(np.array(w)), REQUANTIZED_BITS), False
    blocks = np.asarray(t.data).reshape(rows * cols // _block_cols(name), -1)
    scale, offset, bits = _scale_offset(name, blocks)
    scale = scale.reshape(rows, cols // GROUP)
    offset = offset.reshape(rows, cols // GROUP)
    grouped = w.reshape(rows, cols // GROUP, GROUP)
    safe = np.where(scale != 0, scale, np.float32(1))
    codes = np.rint((grouped - offset[..., None]) / safe[..., None])
    codes = np.clip(codes, 0, 2 ** bits - 1).astype(np.uint8).reshape(rows, cols)
    return AffineCodes(torch.from_numpy(codes), torch.from_numpy(np.ascontiguousarray(scale)),
                       torch.from_numpy(np.ascontiguousarray(offset)), bits), True


def _block_cols(type_name: str) -> int:
    return 256 if type_name.endswith("_K") else 32


def _unpermute(c: AffineCodes, heads: int) -> AffineCodes:
    """:func:`gguf.unpermute_qk` on the rows of every part (rows are output features)."""
    def rows(a: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(gguf.unpermute_qk(a.numpy(), heads)))

    return AffineCodes(rows(c.codes), rows(c.scale), rows(c.offset), c.bits, c.group)


def quantized_matrices(reader: Any, config: dict[str, Any]
                       ) -> Iterator[tuple[str, AffineCodes]]:
    """``(HF name, codes)`` for every 2-D weight of the file (projections, embeddings,
    ``lm_head``), Q/K rows un-permuted for Llama and Mistral files; one log line names the
    tensor types that are requantized. Call :func:`gguf.check_supported` first."""
    permuted = config["model_type"] in ("llama", "mistral")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    requantized: set[str] = set()
    arch = gguf.field(reader, "general.architecture")
    for t in reader.tensors:
        if len(t.shape) != 2:
            continue
        codes, exact = affine_codes(t)
        if not exact:
            requantized.add(t.tensor_type.name)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if permuted and kind in heads:
            codes = _unpermute(codes, heads[kind])
        yield gguf.hf_name(t.name, arch), codes
    if requantized:
        log.warning("GGUF tensor types %s have no exact kernel layout: requantized at load to "
                    "8-bit codes per %d columns (adds at most (max - min) / 510 per group)",
                    ", ".join(sorted(requantized)), GROUP)
