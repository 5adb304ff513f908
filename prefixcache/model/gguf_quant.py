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


_CHUNK_VALUES = 1 << 20  # weights dequantized at a time (4 MiB of float32)


def affine_codes(t: Any) -> tuple[AffineCodes, bool]:
    """The :class:`AffineCodes` of a 2-D GGUF tensor (a ``ReaderTensor`` or a
    :class:`~prefixcache.model.gguf.MappedTensor`) in PyTorch shape ``[rows, columns]``,
    and whether they are the file's own (``False``: requantized to 8 bits from its float
    values, see the module doc). Read a few rows at a time: the float values of at most
    ``_CHUNK_VALUES`` weights exist at once, never the whole matrix."""
    import gguf as gg

    name = t.tensor_type.name
    cols, rows = (int(n) for n in t.shape)
    exact = name in EXACT_TYPES and cols % GROUP == 0
    codes = torch.empty(rows, cols, dtype=torch.uint8)
    scale = torch.empty(rows, cols // GROUP)
    offset = torch.empty(rows, cols // GROUP)
    bits = REQUANTIZED_BITS
    step = max(1, _CHUNK_VALUES // cols)
    data = t.data.reshape(rows, -1)
    for start in range(0, rows, step):
        raw = np.asarray(data[start:start + step])
        w = gg.quants.dequantize(raw, t.tensor_type).astype(np.float32, copy=False)
        w = w.reshape(raw.shape[0], cols)
        end = start + raw.shape[0]
        if not exact:
            c = AffineCodes.from_float(torch.from_numpy(np.require(w, requirements="W")),
                                       REQUANTIZED_BITS)
            codes[start:end], scale[start:end], offset[start:end] = c.codes, c.scale, c.offset
            continue
        blocks = raw.reshape(raw.shape[0] * cols // _block_cols(name), -1)
        sc, off, bits = _scale_offset(name, blocks)
        sc = sc.reshape(-1, cols // GROUP)
        off = off.reshape(-1, cols // GROUP)
        safe = np.where(sc != 0, sc, np.float32(1))
        q = np.rint((w.reshape(-1, cols // GROUP, GROUP) - off[..., None]) / safe[..., None])
        codes[start:end] = torch.from_numpy(
            np.clip(q, 0, 2 ** bits - 1).astype(np.uint8).reshape(-1, cols))
        scale[start:end], offset[start:end] = torch.from_numpy(sc), torch.from_numpy(off)
    return AffineCodes(codes, scale, offset, bits), exact


def _block_cols(type_name: str) -> int:
    return 256 if type_name.endswith("_K") else 32


def _unpermute(c: AffineCodes, heads: int) -> AffineCodes:
    """:func:`gguf.unpermute_qk` on the rows of every part (rows are output features)."""
    def rows(a: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(gguf.unpermute_qk(a.numpy(), heads)))

    return AffineCodes(rows(c.codes), rows(c.scale), rows(c.offset), c.bits, c.group)


class GGUFWeights:
    """A GGUF file's tensors by HF name, read from its memory map on demand: matrices as
    :class:`AffineCodes` (:meth:`codes`), the rest (norms, biases) as float32
    (:meth:`float`). Nothing is read before it is asked for and nothing is kept.

    Args:
        tensors: the file's tensors (:func:`gguf.mapped_tensors` or a reader's).
        architecture: ``general.architecture``. config: the file's HF config dictionary.

    Attributes:
        names: every HF name. matrices: the HF names of the 2-D weights.
        requantized: the GGUF types requantized so far (see the module doc).
    """

    def __init__(self, tensors: list[Any], architecture: str, config: dict[str, Any]):
        self.arch, self.config = architecture, config
        self._by_name = {gguf.hf_name(t.name, architecture): t for t in tensors
                         if t.name not in gguf.ROPE_FACTOR_TENSORS}
        self.names = set(self._by_name)
        self.matrices = {n for n, t in self._by_name.items() if len(t.shape) == 2}
        self.requantized: set[str] = set()

    def float(self, name: str) -> torch.Tensor:
        """HF tensor ``name`` in float32 (:func:`gguf.hf_tensor`)."""
        t = self._by_name[name]
        w = gguf.hf_tensor(t.name, gguf.dequantize(t), self.arch, self.config)
        return torch.from_numpy(np.require(w, requirements="W"))

    def codes(self, name: str) -> AffineCodes:
        """HF matrix ``name`` as codes, Q/K rows un-permuted for Llama and Mistral files;
        the first requantized tensor of each type is logged."""
        t = self._by_name[name]
        codes, exact = affine_codes(t)
        if not exact and t.tensor_type.name not in self.requantized:
            self.requantized.add(t.tensor_type.name)
            log.warning("GGUF tensor type %s has no exact kernel layout: requantized at load "
                        "to 8-bit codes per %d columns (adds at most (max - min) / 510 per "
                        "group)", t.tensor_type.name, GROUP)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        heads = {"attn_q": self.config["num_attention_heads"],
                 "attn_k": self.config["num_key_value_heads"]}
        if self.config["model_type"] in ("llama", "mistral") and kind in heads:
            codes = _unpermute(codes, heads[kind])
        return codes
