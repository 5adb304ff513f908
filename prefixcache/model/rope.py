"""Rotary position embedding (RoPE), "rotate half" convention as in Hugging Face Llama.

Dimension ``i < dim / 2`` of a head is paired with dimension ``i + dim / 2`` and rotated by
the angle ``position * inv_freq[i]``; ``dim`` is the head's rotated part (``rotary_dim``:
the whole head, or its leading dimensions under partial rotary).

LongRoPE (Phi-3, Phi-4-mini): positions below ``original_max_position_embeddings`` rotate
with the short factors, later ones with the long factors, and cos and sin are multiplied
by ``attention_factor``. The choice is per position, so a position's rotation never
depends on the sequence's length and cached KV stays valid as a sequence grows.
transformers instead recomputes the whole sequence with the long factors once it is longer
than the original length: the two agree below that length.
"""
from __future__ import annotations

import math

import torch

from prefixcache.model.config import RopeScaling

_BLOCK = 1024  # positions per table block


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """float32 ``[head_dim // 2]`` rotation frequencies, radians per position (CPU).

    ``linear`` divides every frequency by ``factor``. ``llama3`` (Llama 3.1) divides the
    low frequencies (wavelength above ``original_max / low_freq_factor``) by ``factor``,
    keeps the high ones (wavelength below ``original_max / high_freq_factor``) and blends
    linearly in between.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if scaling.rope_type == "longrope":  # the short factors; see long_inverse_frequencies
        return 1.0 / (torch.tensor(scaling.short_factor, dtype=torch.float32)
                      * theta ** exponents)
    inv_freq = 1.0 / (theta ** exponents)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type != "llama3":
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = old_len / scaling.low_freq_factor    # longer than this: fully scaled
    high_wavelen = old_len / scaling.high_freq_factor  # shorter than this: untouched
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    blend = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - blend) * scaled / scaling.factor + blend * scaled
    in_between = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(in_between, blended, scaled)


def long_inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling
                             ) -> torch.Tensor:
    """LongRoPE's frequencies from ``original_max_position_embeddings`` on (the long
    factors), float32 ``[head_dim // 2]`` (CPU)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    return 1.0 / (torch.tensor(scaling.long_factor, dtype=torch.float32) * theta ** exponents)


class RotaryEmbedding:
    """cos/sin tables on the model device, grown on demand and indexed by position.

    Args:
        head_dim: rotated dimension (the whole head).
        theta: RoPE base. scaling: frequency scaling.
        device: where the tables live.
    """

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling,
                 device: torch.device | str):
        self.device = torch.device(device)
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling).to(self.device)
        self.long_inv_freq: torch.Tensor | None = None
        self.long_from: int | None = None
        self.attention_factor = 1.0
        if scaling.rope_type == "longrope":
            self.long_inv_freq = long_inverse_frequencies(head_dim, theta, scaling).to(
                self.device)
            self.long_from = scaling.original_max_position_embeddings
            self.attention_factor = scaling.attention_factor
        self._cos = torch.empty(0, head_dim, device=self.device)
        self._sin = torch.empty(0, head_dim, device=self.device)

    def _grow(self, length: int) -> None:
        # Whole blocks of _BLOCK positions, each computed by ops of one fixed shape, so an
        # entry's bits never depend on how far the table had grown (deterministic mode).
        cos, sin = [self._cos], [self._sin]
        for start in range(self._cos.shape[0], length, _BLOCK):
            pos = torch.arange(start, start + _BLOCK, device=self.device).float()
            angles = torch.outer(pos, self.inv_freq)
            if self.long_inv_freq is not None and self.long_from is not None:
                long = (pos >= self.long_from).unsqueeze(1)
                angles = torch.where(long, torch.outer(pos, self.long_inv_freq), angles)
            angles = torch.cat([angles, angles], dim=-1)  # float32 [_BLOCK, head_dim]
            if self.attention_factor != 1.0:
                cos.append(angles.cos() * self.attention_factor)
                sin.append(angles.sin() * self.attention_factor)
            else:
                cos.append(angles.cos())
                sin.append(angles.sin())
        self._cos, self._sin = torch.cat(cos), torch.cat(sin)

    def table(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin tables ``[>= end, head_dim]``, row = position."""
        if end > self._cos.shape[0]:
            self._grow(end)
        return self._cos, self._sin

    def cos_sin(self, positions: torch.Tensor, max_position: int, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, head_dim]`` in ``dtype`` for int64 ``positions [T]`` (on the
        device). ``max_position`` is an upper bound of ``positions`` known on the host, so
        the tables can grow without reading the device tensor."""
        cos, sin = self.table(max_position + 1)
        return cos[positions].to(dtype), sin[positions].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` (any strides) with ``cos``/``sin [T, head_dim]``
    (both halves equal); returns a new contiguous tensor of the same shape.

    Per pair: ``(a, b) -> (a cos - b sin, b cos + a sin)``, the same roundings as
    ``x * cos + rotate_half(x) * sin``.
    """
    half = x.shape[-1] // 2
    cos, sin = cos.unsqueeze(1), sin[:, None, :half]
    a, b = x[..., :half], x[..., half:]
    out = x * cos
    out[..., :half] -= b * sin
    out[..., half:] += a * sin
    return out
