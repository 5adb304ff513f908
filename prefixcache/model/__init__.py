"""The Llama-family model over the paged KV pool, weight loading and tokenizers.

Entry points: :func:`load_model` (a Hugging Face directory or ``"builtin:tiny"``),
:class:`PagedLlama` (``forward(ForwardBatch, KVPool) -> logits``), :class:`Tokenizer`
and :class:`IncrementalDetokenizer`.
"""
from prefixcache.model.config import ModelConfig, RopeScaling
from prefixcache.model.detokenizer import IncrementalDetokenizer
from prefixcache.model.forward_batch import ForwardBatch, SeqChunk
from prefixcache.model.kv_pool import KVPool
from prefixcache.model.llama import PagedLlama
from prefixcache.model.loader import LoadedModel, load_model
from prefixcache.model.tokenizer import Tokenizer

__all__ = ["ForwardBatch", "IncrementalDetokenizer", "KVPool", "LoadedModel", "ModelConfig",
           "PagedLlama", "RopeScaling", "SeqChunk", "Tokenizer", "load_model"]
