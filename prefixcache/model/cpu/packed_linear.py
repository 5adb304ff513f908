"""``F.linear`` with the weight prepacked once for oneDNN (CPU, float32 only).

Used for ``lm_head`` and for every linear layer of the decoder (fused q/k/v, output,
fused gate/up, down): steps with two rows or more (batched decode, deterministic-mode
tiles, prefill) run the packed kernel.

On CPU, ``F.linear`` goes to MKL's sgemm, which repacks the whole weight on every call
with two rows or more. For a vocabulary-sized ``lm_head`` in decode steps (a few rows)
that copy dominates (``benchmarks/decode/RESULTS.md``). The weight is packed once with
``torch.ops.mkldnn._reorder_linear_weight`` and run by ``_linear_pointwise``, the ops
PyTorch's own CPU compiler uses for frozen linear layers. vLLM's CPU backend prepacks its
linear weights with oneDNN for the same reason.

Steps of one to eight rows (decode) run the weight-streaming kernel of
:mod:`prefixcache.model.cpu.kernels.small_gemm` instead when the caller asks for it (the CPU
backend's ``small_gemm`` switch): faster than both at those sizes. Without it, one row
keeps ``F.linear`` (its GEMV path is as fast as the
packed one). Anything but a float32 CPU weight, or a PyTorch without oneDNN, falls back
to ``F.linear``.

oneDNN keeps what it builds for a call (the kernel for that shape: 0.5-2 MiB) in two
caches keyed by the shape, ideep's and oneDNN's own, each holding up to 1,024 entries.
A step's row count is its token count, which takes almost every value up to the token
budget under load, so giving oneDNN each step's rows made resident memory grow by
hundreds of MiB. The packed path therefore hands oneDNN only the row counts of
:data:`KERNEL_ROWS`: a step's rows run as pieces of powers of two from 64 rows up
(at most :data:`PIECE_MAX`), and the last piece of fewer than 64 rows is padded with zero
rows to a multiple of 8 (at most 13 shapes per weight, plain and with the residual add).
A row's bits do not depend on the piece it runs in (tested against one call over all the
rows); a step whose row count is a piece size (a full chunk) runs as one call, no copy.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from prefixcache.model.cpu.kernels import small_gemm as small_gemm_kernel

BATCH_HINT = 8  # rows the packed layout is tuned for (decode batches)
PIECE_MIN = 64  # row pieces of at least this many rows are powers of two
PIECE_MAX = 2048  # the largest row piece
PAD_ROWS = 8  # a last piece below PIECE_MIN is padded to a multiple of this
KERNEL_ROWS = (tuple(range(PAD_ROWS, PIECE_MIN, PAD_ROWS))
               + tuple(1 << k for k in range(PIECE_MIN.bit_length() - 1,
                                             PIECE_MAX.bit_length())))
"""Every row count the packed path hands oneDNN: 8, 16, ..., 56, then 64, 128, ..., 2048."""


def row_pieces(rows: int) -> list[tuple[int, int, int]]:
    """How ``rows`` rows run on the packed path: ``(start, rows, kernel_rows)`` per piece,
    in order, covering ``[0, rows)``; ``kernel_rows`` (in :data:`KERNEL_ROWS`) exceeds
    ``rows`` only for a padded last piece.

    Raises:
        ValueError: ``rows`` < 1.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    pieces, start = [], 0
    while rows - start >= PIECE_MIN:
        n = min(1 << ((rows - start).bit_length() - 1), PIECE_MAX)
        pieces.append((start, n, n))
        start += n
    if start < rows:
        n = rows - start
        pieces.append((start, n, -(-n // PAD_ROWS) * PAD_ROWS))
    return pieces


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor,
                   bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's packed ``x @ W.T + bias``: ``[M, out]`` for contiguous ``x [M, in]``."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _onednn_linear_add(x: torch.Tensor, residual: torch.Tensor, packed: torch.Tensor,
                       bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's packed ``x @ W.T + bias + residual`` (the add in the epilogue), ``[M, out]``."""
    return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, bias, "add")


class PackedLinear:
    """``y = x @ weight.T + bias`` for ``x [N, in]``, ``weight [out, in]`` and ``bias
    [out]`` or ``None``; ``[N, out]`` in ``x``'s dtype. The packed copy (``out * in * 4``
    bytes more memory) is made on the first call with two rows or more and remade
    whenever ``weight`` is modified in place (its version counter changes);
    ``num_packs`` counts how often that happened."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 pack: bool = True):
        self.weight = weight
        self.bias = bias
        self._packed: torch.Tensor | None = None
        self._version = -1
        self.num_packs = 0
        self.cpu_float32 = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.enabled = (pack and self.cpu_float32
                        and torch.backends.mkldnn.is_available()
                        and hasattr(torch.ops.mkldnn, "_linear_pointwise"))

    def prepack(self) -> bool:
        """Make the packed copy now (at load) instead of in the first multi-row call;
        ``False`` when packing does not apply (not a float32 CPU weight, no oneDNN)."""
        if not self.enabled:
            return False
        if self._packed is None or self._version != self.weight._version:
            try:
                self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(),
                                                                       BATCH_HINT)
            except RuntimeError:  # an oneDNN build without this path: stay on F.linear
                self.enabled = False
                return False
            self._version = self.weight._version
            self.num_packs += 1
        return True

    def __call__(self, x: torch.Tensor, residual: torch.Tensor | None = None,
                 small_gemm: bool = False) -> torch.Tensor:
        """``x @ weight.T + bias``, plus ``residual [N, out]`` when given. On the packed
        path the residual is added in the matrix product's epilogue (one pass less over
        the output; the same bits as adding it after: the sum of the same two floats).
        ``small_gemm``: 1-8 float32 rows run the small-GEMM kernel (which must be built:
        :func:`prefixcache.model.cpu.kernels.build.load`)."""
        if (small_gemm and self.cpu_float32 and 1 <= x.shape[0] <= small_gemm_kernel.MAX_ROWS
                and x.dim() == 2 and x.dtype == torch.float32 and x.stride(-1) == 1
                and self.weight.is_contiguous()):
            if residual is None or (residual.shape == (x.shape[0], self.weight.shape[0])
                                    and residual.dtype == torch.float32
                                    and residual.stride(-1) == 1):
                return small_gemm_kernel.linear(x, self.weight, self.bias, residual)
            return residual + small_gemm_kernel.linear(x, self.weight, self.bias)
        if (not self.enabled or x.shape[0] < 2 or x.dtype != torch.float32 or x.dim() != 2
                or not self.prepack()):
            y = F.linear(x, self.weight, self.bias)
            return y if residual is None else residual + y
        y_shape = (x.shape[0], self.weight.shape[0])
        if residual is None or residual.shape != y_shape or residual.dtype != x.dtype:
            y = self._packed_rows(x.contiguous(), None)
            return y if residual is None else residual + y  # broadcasting, promotion
        return self._packed_rows(x.contiguous(), residual.contiguous())

    def _packed_rows(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        """The packed kernel over contiguous ``x [M, in]`` (plus contiguous ``residual
        [M, out]``) in the pieces of :func:`row_pieces`, so that oneDNN sees only the row
        counts of :data:`KERNEL_ROWS`."""
        assert self._packed is not None
        pieces = row_pieces(x.shape[0])
        if len(pieces) == 1:  # one call: its rows, no copy into an output (a view if padded)
            return self._kernel(*_padded(x, residual, pieces[0][2]))[:x.shape[0]]
        y = torch.empty(x.shape[0], self.weight.shape[0], dtype=x.dtype, device=x.device)
        for start, n, kernel_rows in pieces:
            xs = x[start:start + n]
            rs = None if residual is None else residual[start:start + n]
            y[start:start + n] = self._kernel(*_padded(xs, rs, kernel_rows))[:n]
        return y

    def _kernel(self, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        assert self._packed is not None
        if residual is None:
            return _onednn_linear(x, self._packed, self.bias)
        return _onednn_linear_add(x, residual, self._packed, self.bias)


def _padded(x: torch.Tensor, residual: torch.Tensor | None, rows: int
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` (and ``residual``) with zero rows appended up to ``rows``."""
    n = x.shape[0]
    if rows == n:
        return x, residual
    x = torch.cat([x, x.new_zeros(rows - n, x.shape[1])])
    if residual is not None:
        residual = torch.cat([residual, residual.new_zeros(rows - n, residual.shape[1])])
    return x, residual
