"""Linear layers of a few rows (decode steps) on the CPU, from ``small_gemm.cpp``.

At one to eight rows a linear layer is bound by reading its weight once. oneDNN's packed
GEMM and MKL's sgemm read it at well below that rate at 2-8 rows
(``benchmarks/decode/RESULTS.md``). Here each block of four
weight rows is read from memory once and dotted with every x row while in L1; an output
element is summed in the same order whatever the number of rows, so a row's result does
not depend on the other rows of the step. Built with the other CPU kernels
(:mod:`.build`); used by :mod:`prefixcache.model.cpu.backend` when its ``small_gemm``
switch is on (off, the linears run oneDNN's packed kernel, or ``F.linear`` at one row).
"""
from __future__ import annotations

import torch

from prefixcache.model.cpu.kernels import build

MAX_ROWS = 8  # rows this path is used for

load = build.load
failure = build.failure


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T (+ bias) (+ residual)``, float32 ``[M, N]``.

    Args:
        x: float32 ``[M, K]``, 1 <= M <= ``MAX_ROWS``, rows contiguous.
        weight: contiguous float32 ``[N, K]``. bias: float32 ``[N]`` or ``None``.
        residual: float32 ``[M, N]`` (rows contiguous) added to the result, or ``None``.

    Raises:
        RuntimeError: the kernel is unavailable (check :func:`load` first), or a shape,
            dtype or layout other than the above.
    """
    mod = build.load()
    if mod is None:
        raise RuntimeError(f"small GEMM kernel unavailable: {build.failure() or 'disabled'}")
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    mod.small_linear(x, weight, bias, residual, out)
    return out
