"""prefixcache: an LLM inference engine built around automatic prefix caching."""
from prefixcache.outputs import CompletionOutput, RequestOutput
from prefixcache.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "EngineConfig"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy: `prefixcache analyze` and the cache core never import torch models.
    if name == "LLM":
        from prefixcache.engine.llm import LLM
        return LLM
    if name == "EngineConfig":
        from prefixcache.config import EngineConfig
        return EngineConfig
    raise AttributeError(name)
