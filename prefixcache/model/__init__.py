"""The Llama-family model over the paged KV pool and weight loading (tokenizers live in
:mod:`prefixcache.text`).

Entry points: :func:`load_model` (a Hugging Face directory or ``"builtin:tiny"``) and
:class:`PagedLlama` (``forward(ForwardBatch, KVPool) -> logits``).
"""
from prefixcache.model.config import ModelConfig, RopeScaling
from prefixcache.model.forward_batch import ForwardBatch, SeqChunk
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.llama import PagedLlama
from prefixcache.model.loader import LoadedModel, load_model

__all__ = ["ForwardBatch", "KVPool", "LoadedModel", "ModelConfig", "PagedLlama", "RopeScaling",
           "SeqChunk", "load_model"]
