"""Fused elementwise ops of the decoder layer (CPU, float32), from ``fused_ops.cpp``.

Each op does in one pass what a chain of torch ops does in several, with the same
roundings in the same order, so it returns the bits torch returns:

* :func:`rope_write`: RoPE of q and k in place in the fused qkv projection, and the KV
  write into the pool (``apply_rope`` and two ``index_copy_`` calls);
* :func:`silu_mul`: ``F.silu(gate).mul_(up)`` from the fused gate/up projection;
* :func:`rms_apply`: ``(x * r).mul_(weight)``, RMSNorm after its mean square (the mean
  stays a torch reduction: its summation order is torch's).

(With several intra-op threads torch may split a row between threads and compute a few
elements of ``F.silu`` on its scalar path, so there the two can differ by a rounding at
those elements; at one thread, the setting of the benchmarks, they agree everywhere.)

The first :func:`available` call requires torch's CPU kernels to use this build's vector
width (AVX-512 or AVX2), then compares each op with the torch ops it replaces on random
data (rows with and without a scalar tail); unless every bit agrees, the model
keeps the torch ops (logged once). Used by :mod:`prefixcache.model.cpu.backend` when its
``fused_ops`` switch is on. Built with the other CPU kernels (:mod:`.build`).
"""
from __future__ import annotations

import logging
import threading

import torch
import torch.nn.functional as F

from prefixcache.model.cpu.kernels import build
from prefixcache.model.rope import apply_rope

log = logging.getLogger(__name__)

_lock = threading.Lock()
_checked: bool | None = None  # None: not checked yet


def available() -> bool:
    """Whether the ops are built and bit-identical to the torch ops they replace here
    (checked once per process; builds the kernels on first call)."""
    global _checked
    if _checked is None:
        with _lock:
            if _checked is None:
                mod = build.load()
                _checked = mod is not None and _self_check()
    return _checked


def torch_vector_width() -> int:
    """Lanes of torch's float vectors in its CPU kernels here (16: AVX-512, 8: AVX2, else
    1); the fused ``silu_mul`` returns torch's bits only where its build has the same
    width (:func:`build_vector_width`)."""
    cap = torch.backends.cpu.get_cpu_capability()
    return 16 if cap.startswith("AVX512") else 8 if cap == "AVX2" else 1


def build_vector_width() -> int:
    """Lanes of the fused ``silu_mul``'s vector exp in this build (16, 8 or 1)."""
    return int(_module().fused_vector_width())


def rope_write(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_heads: int,
               slots: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> None:
    """Rotate the q and k heads of ``qkv`` in place and write its k and v to the pool.

    Args:
        qkv: float32 ``[T, (num_heads + 2 * kv_heads) * head_dim]`` (q heads, k heads, v
            heads; rows contiguous, any row stride), rotated in place.
        cos, sin: float32 ``[T, head_dim]`` (both halves equal), the tokens' RoPE rows.
        num_heads: query heads.
        slots: int64 ``[T]``, each token's slot (``page * block_size + offset``).
        k_pool, v_pool: one layer of the pool, ``[P, block_size, kv_heads, head_dim]``,
            float32 or bfloat16 (written with round-to-nearest-even).

    Raises:
        RuntimeError: a shape, dtype or layout other than the above, or a slot outside
            the pool (nothing is written then).
    """
    _module().rope_write(qkv, cos, sin, int(num_heads), slots, k_pool, v_pool)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, float32 ``[T, I]``, for ``gate_up [T, 2 * I]`` (gate columns
    first; rows contiguous). Raises ``RuntimeError`` for another dtype or layout."""
    n, two_i = gate_up.shape
    out = torch.empty(n, two_i // 2, dtype=torch.float32, device=gate_up.device)
    _module().silu_mul(gate_up, out)
    return out


def rms_apply(x: torch.Tensor, r: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``(x * r) * weight``, float32 ``[T, h]``, for ``x [T, h]``, ``r [T, 1]`` and
    ``weight [h]`` (float32). Raises ``RuntimeError`` for another dtype or layout."""
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    _module().rms_apply(x, r, weight, out)
    return out


def _module():
    mod = build.load()
    if mod is None:
        raise RuntimeError(f"fused ops unavailable: {build.failure() or 'disabled'}")
    return mod


def _self_check() -> bool:
    """Each op against the torch ops it replaces, bit for bit, on random rows."""
    if build_vector_width() != torch_vector_width():  # silu's split into vector and
        log.warning("fused CPU ops built for %d-lane vectors, torch's kernels use %d: the "
                    "model runs torch ops", build_vector_width(), torch_vector_width())
        return False                                  # scalar parts would differ
    g = torch.Generator().manual_seed(0)
    bad = []
    for width in (1000, 1536, 37, 48):  # scalar tails of 8, none, 5 and 16
        gu = torch.randn(5, 2 * width, generator=g) * 4
        gate, up = gu.chunk(2, dim=-1)
        if not torch.equal(silu_mul(gu), F.silu(gate).mul_(up)):
            bad.append(f"silu_mul (width {width})")
        x = torch.randn(5, width, generator=g)
        w = torch.randn(width, generator=g)
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        if not torch.equal(rms_apply(x, r, w), (x * r).mul_(w)):
            bad.append(f"rms_apply (width {width})")
    heads, kvh, d, n = 3, 1, 64, 6
    for pool_dtype in (torch.float32, torch.bfloat16):
        qkv = torch.randn(n, (heads + 2 * kvh) * d, generator=g)
        ang = torch.rand(n, d // 2, generator=g) * 100
        cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
        want = apply_rope(qkv[:, :(heads + kvh) * d].unflatten(-1, (-1, d)), cos, sin)
        k_pool = torch.zeros(2, 4, kvh, d, dtype=pool_dtype)
        v_pool = torch.zeros_like(k_pool)
        slots = torch.tensor([5, 0, 7, 2, 3, 6])
        got = qkv.clone()
        rope_write(got, cos, sin, heads, slots, k_pool, v_pool)
        k_want, v_want = torch.zeros_like(k_pool), torch.zeros_like(v_pool)
        k_want.view(-1, kvh, d)[slots] = want[:, heads:].to(pool_dtype)
        v_want.view(-1, kvh, d)[slots] = qkv[:, (heads + kvh) * d:].view(n, kvh, d).to(pool_dtype)
        if not (torch.equal(got[:, :(heads + kvh) * d].view(n, -1, d), want)
                and torch.equal(k_pool, k_want) and torch.equal(v_pool, v_want)):
            bad.append(f"rope_write ({pool_dtype})")
    if bad:
        log.warning("fused CPU ops differ from torch's here (%s): the model runs torch ops",
                    ", ".join(bad))
    return not bad
