"""``ToyEmbedder``: lowercased words hashed into a 64-dim signed bag, L2-normalised.

Deterministic and model-free: texts sharing words score high, so the cache logic can be
tested without the 90 MB model. Texts with the same words in any case map to the same vector.
"""
from __future__ import annotations

import hashlib
import re

import numpy as np


class ToyEmbedder:
    dim = 64

    def __init__(self) -> None:
        self.calls = 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()) or [""]:
                h = hashlib.blake2b(word.encode(), digest_size=4).digest()
                out[i, h[0] % self.dim] += 1.0 if h[1] % 2 else -1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else np.eye(self.dim, dtype=np.float32)[0]
        return out
