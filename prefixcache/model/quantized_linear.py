"""Weight-only low-bit linear layers: weights kept as group-wise affine integer codes and
run through torch's CPU int4 kernel (``_weight_int4pack_mm_for_cpu``).

A weight ``[out, in]`` is held as :class:`AffineCodes`: per group of ``group`` input
columns of one row, ``w = code * scale + offset`` with ``code`` an unsigned integer of
``bits`` bits (1 to 8). This is exactly the form of GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K and Q5_K blocks (:mod:`prefixcache.model.gguf_quant`) and of a min/max quantization
of a float weight (:meth:`AffineCodes.from_float`, for ``--quantization int4|int8``).

:class:`Int4Linear` runs it. Codes of up to 4 bits are one int4 plane; codes of 5 to 8
bits are split into two planes, ``code = 16 * high + low``, laid side by side along the
input dimension, and the activations are repeated once: one kernel call computes
``x @ (high_plane * 16 * scale).T + x @ (low_plane * scale + offset').T``; two planes cost
little more than one and much less than float32 (``benchmarks/quantized/RESULTS.md``).
torch's int8 weight-only op (``_weight_int8pack_mm``, per-channel scales only) is far
slower than float32 on this project's CPU (same file), so 8-bit codes use two int4 planes
instead.

Precision: the kernel is fast only with bfloat16 activations and bfloat16 scales/zeros
(float32 or float16 activations take its reference path, many times slower than float32
``F.linear``), so activations, scales and zero points are rounded to bfloat16 and the
output is bfloat16 before it is cast back to ``x``'s dtype. :func:`error_bound` states the
resulting bound against the float product with the dequantized weight; it is tested.

Off the CPU (CUDA), the layer dequantizes its codes once to a bfloat16 weight and runs
``F.linear`` (the codes are not kept): correct, not memory-saving.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GROUP = 32  # input columns per scale/offset: GGUF's block size and the kernel's smallest
_PLANE = 16  # int4 values per plane
_PACK_ROWS = 256  # rows packed at a time (the kernel's layout is per 64 rows or fewer)


@dataclass
class AffineCodes:
    """A weight ``[out, in]`` as ``codes * scale + offset`` per group of input columns.

    Attributes:
        codes: ``uint8 [out, in]``, each ``< 2 ** bits``.
        scale, offset: ``float32 [out, in // group]``.
        bits: code width, 1 to 8. group: input columns per scale (``in % group == 0``).
    """

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int
    group: int = GROUP

    @property
    def shape(self) -> tuple[int, int]:
        """``(out, in)``."""
        return int(self.codes.shape[0]), int(self.codes.shape[1])

    def dequantize(self) -> torch.Tensor:
        """The float32 weight ``[out, in]`` (``code * scale + offset``, in that order)."""
        out, inn = self.shape
        c = self.codes.view(out, inn // self.group, self.group).float()
        return (c * self.scale[..., None] + self.offset[..., None]).view(out, inn)

    @staticmethod
    def from_float(weight: torch.Tensor, bits: int, group: int = GROUP) -> AffineCodes:
        """Min/max (asymmetric) quantization of ``weight [out, in]`` to ``bits``-bit codes,
        one scale and offset (the group's minimum) per ``group`` columns.

        Raises:
            ValueError: ``bits`` not in 1..8, or ``in`` not a multiple of ``group``.
        """
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be 1..8, got {bits}")
        out, inn = weight.shape
        if inn % group:
            raise ValueError(f"weight has {inn} input columns, not a multiple of the "
                             f"quantization group size {group}")
        w = weight.detach().float().view(out, inn // group, group)
        lo, hi = w.amin(-1), w.amax(-1)
        scale = (hi - lo) / (2 ** bits - 1)
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = ((w - lo[..., None]) / safe[..., None]).round_().clamp_(0, 2 ** bits - 1)
        return AffineCodes(codes.to(torch.uint8).view(out, inn), scale.contiguous(),
                           lo.contiguous(), bits, group)

    @staticmethod
    def cat(parts: list[AffineCodes]) -> AffineCodes:
        """The row-wise concatenation of ``parts`` (a fused q/k/v or gate/up weight), at
        the widest code width among them.

        Raises:
            ValueError: the parts have different input widths or group sizes.
        """
        if len({p.shape[1] for p in parts}) != 1 or len({p.group for p in parts}) != 1:
            raise ValueError("quantized weights to fuse differ in input width or group size")
        return AffineCodes(torch.cat([p.codes for p in parts]),
                           torch.cat([p.scale for p in parts]),
                           torch.cat([p.offset for p in parts]),
                           max(p.bits for p in parts), parts[0].group)

    def planes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The kernel's operands: ``int32 [out, P * in]`` int4 values (``P`` = 1 plane for
        up to 4 bits, else 2: high nibble first) and ``float32 [P * in // group, out, 2]``
        scale and zero with ``w = sum_p (v_p - 8) * scale_p + zero_p``."""
        out, inn = self.shape
        c = self.codes.to(torch.int32)
        scale, offset = self.scale, self.offset
        if self.bits <= 4:
            sz = torch.stack([scale, offset + 8 * scale], -1)
            return c.contiguous(), sz.transpose(0, 1).contiguous()
        high, low = c // _PLANE, c % _PLANE
        zero = offset + 8 * (_PLANE + 1) * scale  # (h-8)*16s + (l-8)*s + 8*17*s + offset
        sz_high = torch.stack([_PLANE * scale, torch.zeros_like(scale)], -1)
        sz_low = torch.stack([scale, zero], -1)
        sz = torch.cat([sz_high, sz_low], dim=1)  # [out, 2G, 2]
        return (torch.cat([high, low], dim=1).contiguous(),
                sz.transpose(0, 1).contiguous())


def error_bound(x: torch.Tensor, codes: AffineCodes, y_ref: torch.Tensor) -> torch.Tensor:
    """The bound ``[N, out]`` that :class:`Int4Linear` keeps against the float product
    ``y_ref = x @ codes.dequantize().T``: ``2 ** -7 * (|x| @ A.T) + 2 ** -8 * |y_ref|``,
    where ``A = |code - c| * scale + |offset'|`` per plane is the magnitude of the
    terms the kernel sums (bfloat16 rounding of activations, scales and zeros, each a
    relative ``2 ** -9``, and of the output; float32 accumulation is far below)."""
    v, sz = codes.planes()
    _, inn = codes.shape
    groups = sz.shape[0]
    vv = (v.float() - 8).abs().view(v.shape[0], groups, -1)
    mag = vv * sz[..., 0].t().abs()[..., None] + sz[..., 1].t().abs()[..., None]
    mag = mag.view(v.shape[0], -1)
    xr = x.float().abs()
    if mag.shape[1] != inn:
        xr = torch.cat([xr, xr], dim=-1)
    return 2.0 ** -7 * (xr @ mag.t()) + 2.0 ** -8 * y_ref.abs()


class Int4Linear:
    """``y = x @ W.T + bias`` with ``W`` kept as packed int4 planes (see the module doc).

    Args:
        codes: the weight ``[out, in]`` (``in % 32 == 0``; group sizes 32, 64, 128, 256).
        bias: ``[out]`` or None (applied in ``x``'s dtype).

    ``out`` need not be a multiple of 16 (the kernel's packing): zero rows are added and
    cut from the output.

    Attributes:
        out_features, in_features, bits, group, planes (1 or 2); ``nbytes``: memory held.
    """

    def __init__(self, codes: AffineCodes, bias: torch.Tensor | None = None):
        self.out_features, self.in_features = codes.shape
        self.bits, self.group = codes.bits, codes.group
        self.bias = bias
        device = codes.codes.device
        self.weight_bf16: torch.Tensor | None = None
        if device.type != "cpu":
            self.weight_bf16 = codes.dequantize().to(torch.bfloat16)
            self.planes = 0
            self.packed = torch.empty(0, dtype=torch.uint8, device=device)
            self.scale_zero = torch.empty(0, dtype=torch.bfloat16, device=device)
            return
        pad = -self.out_features % 16  # the kernel packs 16 rows at a time
        if pad:  # zero rows (scale 0, offset 0), cut from the output
            codes = AffineCodes.cat([codes, AffineCodes(
                torch.zeros(pad, self.in_features, dtype=torch.uint8),
                torch.zeros(pad, codes.scale.shape[1]), torch.zeros(pad, codes.scale.shape[1]),
                codes.bits, codes.group)])
        self.planes = 1 if self.bits <= 4 else 2
        rows, groups = self.out_features + pad, codes.scale.shape[1] * self.planes
        # the kept tensors first, then each chunk's int32 operands (freed at once): no
        # short-lived buffer sits between two kept ones in the heap
        self.packed = torch.empty(rows, self.planes * self.in_features // 2,
                                  dtype=torch.uint8)
        self.scale_zero = torch.empty(groups, rows, 2, dtype=torch.bfloat16)
        for start in range(0, rows, _PACK_ROWS):
            end = min(rows, start + _PACK_ROWS)
            chunk = AffineCodes(codes.codes[start:end], codes.scale[start:end],
                                codes.offset[start:end], codes.bits, codes.group)
            v, sz = chunk.planes()
            self.packed[start:end] = torch.ops.aten._convert_weight_to_int4pack_for_cpu(v, 1)
            self.scale_zero[:, start:end] = sz
            del v, sz

    @property
    def nbytes(self) -> int:
        """Bytes of weight memory this layer holds (packed values, scales, zeros)."""
        if self.weight_bf16 is not None:
            return self.weight_bf16.nbytes
        return self.packed.nbytes + self.scale_zero.nbytes

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x [N, in] @ W.T + bias`` ``[N, out]`` in ``x``'s dtype, plus ``residual``."""
        xb = x.to(torch.bfloat16)
        if self.weight_bf16 is not None:
            y = F.linear(xb, self.weight_bf16)
        else:
            if self.planes == 2:
                xb = torch.cat([xb, xb], dim=-1)
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), self.packed,
                                                           self.group, self.scale_zero)
            if y.shape[-1] != self.out_features:
                y = y[:, :self.out_features]
        y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y if residual is None else residual + y
