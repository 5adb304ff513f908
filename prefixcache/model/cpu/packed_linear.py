"""``F.linear`` with the weight prepacked once for oneDNN (CPU, float32 only).

Used for ``lm_head`` and for every linear layer of the decoder (fused q/k/v, output,
fused gate/up, down): steps with two rows or more (batched decode, deterministic-mode
tiles, prefill) run the packed kernel.

On CPU, ``F.linear`` goes to MKL's sgemm, which repacks the whole weight on every call
with two rows or more. For a vocabulary-sized ``lm_head`` in decode steps (a few rows)
that copy dominates: on one core of this project's 2-core Xeon, a float32
``[50257, 512]`` weight took 13.7 ms for 4 rows and 23.1 ms for 8 with ``F.linear``
against 8.7 ms and 10.2 ms prepacked (6.3 ms for 1 row either way; measured with
``torch.ops.mkldnn._reorder_linear_weight`` / ``_linear_pointwise``, the ops PyTorch's
own CPU compiler uses for frozen linear layers). vLLM's CPU backend prepacks its
linear weights with oneDNN for the same reason.

Steps of one to eight rows (decode) run the weight-streaming kernel of
:mod:`prefixcache.model.cpu.kernels.small_gemm` instead when the caller asks for it (the CPU
backend's ``small_gemm`` switch): faster than both at those sizes. Without it, one row
keeps ``F.linear`` (its GEMV path is as fast as the
packed one). Anything but a float32 CPU weight, or a PyTorch without oneDNN, falls back
to ``F.linear``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from prefixcache.model.cpu.kernels import small_gemm as small_gemm_kernel

BATCH_HINT = 8  # rows the packed layout is tuned for (decode batches)


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
            y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, self.bias,
                                                   "none", [], "")
            return y if residual is None else residual + y  # broadcasting, promotion
        return torch.ops.mkldnn._linear_pointwise.binary(x.contiguous(), residual.contiguous(),
                                                         self._packed, self.bias, "add")
