"""Usage normalised across providers, priced with ``prefixcache analyze``'s price sheets.

Every upstream answer becomes five counters (``../shared/PROVIDERS.md`` section 1.6):

============  ============================  ===============  =========================  =====
provider      uncached input                cache read       cache write 5m / 1h        output
============  ============================  ===============  =========================  =====
openai        prompt - cached - write       cached_tokens    cache_write_tokens / 0     completion
anthropic     input_tokens                  cache_read_...   cache_creation.ephemeral_  output
                                                             5m / 1h (all 5m if absent)
deepseek      prompt_cache_miss_tokens      ..._hit_tokens   0 / 0                      completion
prefixcache,  prompt - cached               cached_tokens    0 / 0                      completion
vllm
============  ============================  ===============  =========================  =====

A missing ``cached_tokens`` (vLLM without ``--enable-prompt-tokens-details``) reads as 0.
Prices: the provider's built-in sheet (``prefixcache/analyze/prices``), the row of the
request's model (longest sheet name it starts with, else the sheet's default model);
prefixcache and vllm use the ``self-hosted`` sheet. Anthropic writes cost the ``5m`` and
``1h`` modes' write multipliers; OpenAI writes 1.25x input (GPT-5.6 rule).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from prefixcache.analyze.pricing import Prices, load_sheet, resolve

_SHEETS = {"openai": "openai", "anthropic": "anthropic", "deepseek": "deepseek",
           "prefixcache": "self-hosted", "vllm": "self-hosted"}
OPENAI_WRITE_MULTIPLIER = 1.25


@dataclass(frozen=True)
class NormalUsage:
    uncached: int = 0
    cache_read: int = 0
    write_5m: int = 0
    write_1h: int = 0
    output: int = 0

    @property
    def prompt(self) -> int:
        return self.uncached + self.cache_read + self.write_5m + self.write_1h


def _n(d: dict | None, key: str) -> int:
    v = (d or {}).get(key)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def normalize(provider: str, usage: dict) -> NormalUsage:
    """The five counters of a provider's ``usage`` object."""
    if provider == "anthropic":
        write = _n(usage, "cache_creation_input_tokens")
        split = usage.get("cache_creation")
        w1h = _n(split, "ephemeral_1h_input_tokens") if isinstance(split, dict) else 0
        return NormalUsage(_n(usage, "input_tokens"), _n(usage, "cache_read_input_tokens"),
                           write - w1h, w1h, _n(usage, "output_tokens"))
    if provider == "deepseek" and ("prompt_cache_hit_tokens" in usage
                                   or "prompt_cache_miss_tokens" in usage):
        return NormalUsage(_n(usage, "prompt_cache_miss_tokens"),
                           _n(usage, "prompt_cache_hit_tokens"), 0, 0,
                           _n(usage, "completion_tokens"))
    prompt = _n(usage, "prompt_tokens")
    cached = _n(usage.get("prompt_tokens_details"), "cached_tokens")
    write = _n(usage, "cache_write_tokens") if provider == "openai" else 0
    return NormalUsage(max(0, prompt - cached - write), cached, write, 0,
                       _n(usage, "completion_tokens"))


@lru_cache(maxsize=64)
def prices_for(provider: str, model: str) -> tuple[Prices, ...]:
    """The sheet's prices (one per mode) for ``model`` under ``provider``."""
    sheet = load_sheet(_SHEETS.get(provider, "openai"))
    name = max((n for n in sheet["models"] if model.startswith(n)), key=len, default=None)
    return tuple(resolve(sheet, name))


def cost(provider: str, model: str, u: NormalUsage) -> float:
    """What the upstream bills for ``u``, in the sheet's currency (USD)."""
    modes = prices_for(provider, model)
    p = modes[0]
    by_mode = {m.mode: m for m in modes}
    w5 = by_mode["5m"].write if "5m" in by_mode else p.input * OPENAI_WRITE_MULTIPLIER
    w1 = by_mode["1h"].write if "1h" in by_mode else w5
    return (u.uncached * p.input + u.cache_read * p.read + u.write_5m * w5
            + u.write_1h * w1 + u.output * p.output)


def cost_uncached(provider: str, model: str, u: NormalUsage) -> float:
    """What ``u`` would cost with no upstream prefix cache: every prompt token at the
    input price."""
    p = prices_for(provider, model)[0]
    return u.prompt * p.input + u.output * p.output
