"""Providers' recorded usage fields, normalised to one shape.

=============  ==================================================================
provider       fields read
=============  ==================================================================
openai         ``prompt_tokens``, ``prompt_tokens_details.cached_tokens``,
               ``completion_tokens`` (Chat Completions); ``input_tokens``,
               ``input_tokens_details.cached_tokens``, ``output_tokens`` (Responses)
anthropic      ``input_tokens`` (uncached only), ``cache_creation_input_tokens``,
               ``cache_read_input_tokens``, ``output_tokens``; the prompt is their sum
deepseek       ``prompt_cache_hit_tokens``, ``prompt_cache_miss_tokens``,
               ``completion_tokens``; the prompt is hit + miss
gemini         ``promptTokenCount``, ``cachedContentTokenCount``,
               ``candidatesTokenCount`` (or their snake_case forms)
=============  ==================================================================

In every case ``prompt_tokens`` is the whole prompt (cached, written and uncached),
``cached_tokens`` the part read from the provider's cache, and ``cache_write_tokens``
the part written to it at a premium (Anthropic only).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Usage:
    provider: str
    prompt_tokens: int
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    completion_tokens: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


def _int(d: dict | None, *keys: str) -> int | None:
    """The first of ``keys`` present in ``d`` with a number (``None`` if none)."""
    if not isinstance(d, dict):
        return None
    for k in keys:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return int(v)
    return None


def normalize_usage(u: dict | None) -> Usage | None:
    """Read a provider's ``usage`` object; ``None`` if it is not one we know."""
    if not isinstance(u, dict):
        return None
    hit = _int(u, "prompt_cache_hit_tokens")
    miss = _int(u, "prompt_cache_miss_tokens")
    if hit is not None or miss is not None:  # DeepSeek
        hit, miss = hit or 0, miss or 0
        return Usage("deepseek", hit + miss, hit, 0, _int(u, "completion_tokens") or 0)
    if "promptTokenCount" in u or "prompt_token_count" in u:  # Gemini usageMetadata
        return Usage("gemini", _int(u, "promptTokenCount", "prompt_token_count") or 0,
                     _int(u, "cachedContentTokenCount", "cached_content_token_count") or 0,
                     0, _int(u, "candidatesTokenCount", "candidates_token_count") or 0)
    if "prompt_tokens" in u:  # OpenAI Chat Completions (and vLLM, SGLang, ...)
        cached = _int(u.get("prompt_tokens_details"), "cached_tokens") or 0
        return Usage("openai", _int(u, "prompt_tokens") or 0, cached, 0,
                     _int(u, "completion_tokens") or 0)
    if "input_tokens_details" in u:  # OpenAI Responses API: input includes cached
        cached = _int(u.get("input_tokens_details"), "cached_tokens") or 0
        return Usage("openai", _int(u, "input_tokens") or 0, cached, 0,
                     _int(u, "output_tokens") or 0)
    if "input_tokens" in u:  # Anthropic: input_tokens excludes cache reads and writes
        read = _int(u, "cache_read_input_tokens") or 0
        write = _int(u, "cache_creation_input_tokens") or 0
        return Usage("anthropic", (_int(u, "input_tokens") or 0) + read + write, read,
                     write, _int(u, "output_tokens") or 0)
    return None
