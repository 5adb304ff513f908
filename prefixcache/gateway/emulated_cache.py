"""The caching rules the provider emulators apply (``../shared/PROVIDERS.md``), without HTTP.

Tokens are estimated as characters / 4. Entries are ``(org, prefix hash) -> expiry``;
``org`` is the caller's API key as sent (each organisation has its own cache).
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator

from prefixcache.cache.hashing import blake2b_128
from prefixcache.gateway.shaping import LOOKBACK_BLOCKS, min_cacheable_tokens
from prefixcache.server import anthropic_wire as wire

OPENAI_MIN, OPENAI_STEP, OPENAI_IDLE_S = 1024, 128, 600.0
DEEPSEEK_UNIT = 64


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _h(text: str) -> bytes:
    return blake2b_128(text.encode())


class EmulatedCache:
    """One provider's prompt cache: ``openai_usage`` (OpenAI, DeepSeek) and
    ``anthropic_usage`` answer a request's usage and store what it makes cacheable."""

    def __init__(self, provider: str, clock: Callable[[], float] = time.monotonic):
        self.provider = provider
        self.clock = clock
        self.entries: dict[tuple[str, bytes], float] = {}

    def alive(self, key: tuple[str, bytes]) -> bool:
        exp = self.entries.get(key)
        return exp is not None and exp > self.clock()

    def openai_usage(self, org: str, prompt: str, out: int) -> dict:
        n = tokens(prompt)
        step = DEEPSEEK_UNIT if self.provider == "deepseek" else OPENAI_STEP
        low = DEEPSEEK_UNIT if self.provider == "deepseek" else OPENAI_MIN
        marks = list(range(low, n + 1, step)) if n >= low else []
        hit = max((m for m in marks if self.alive((org, _h(prompt[:4 * m])))), default=0)
        for m in marks:
            self.entries[(org, _h(prompt[:4 * m]))] = self.clock() + OPENAI_IDLE_S
        if self.provider == "deepseek":
            return {"prompt_tokens": n, "completion_tokens": out, "total_tokens": n + out,
                    "prompt_cache_hit_tokens": hit, "prompt_cache_miss_tokens": n - hit}
        return {"prompt_tokens": n, "completion_tokens": out, "total_tokens": n + out,
                "prompt_tokens_details": {"cached_tokens": hit}}

    def anthropic_usage(self, org: str, body: dict, out: int) -> dict:
        blocks: list[tuple[str, dict]] = [(json.dumps({k: v for k, v in t.items()
                                                       if k != "cache_control"},
                                                      sort_keys=True), t)
                                          for t in body.get("tools") or []]
        system = body.get("system") or []
        if isinstance(system, str):
            system = [{"type": "text", "text": system}]
        for m in body.get("messages", []):
            c = m["content"]
            parts = [{"type": "text", "text": c}] if isinstance(c, str) else c
            system = [*system, *[{**p, "_role": m["role"]} for p in parts]]
        for b in system:
            text = b.get("text") if b.get("type") == "text" else json.dumps(
                {k: v for k, v in b.items() if k not in ("cache_control", "_role")},
                sort_keys=True)
            blocks.append((f"{b.get('_role', 'system')}:{text}", b))
        sums, hashes, acc = [0], [], ""
        for text, _ in blocks:
            acc += text + "\x00"
            sums.append(sums[-1] + tokens(text))
            hashes.append(_h(acc))
        bps = [i for i, (_, b) in enumerate(blocks) if b.get("cache_control")]
        minimum = min_cacheable_tokens(str(body.get("model")))
        read = 0
        for bp in bps:
            for i in range(bp, max(-1, bp - LOOKBACK_BLOCKS), -1):
                if self.alive((org, hashes[i])):
                    read = max(read, sums[i + 1])
                    break
        eligible = [bp for bp in bps if sums[bp + 1] >= minimum]
        for bp in eligible:
            ttl = blocks[bp][1]["cache_control"].get("ttl", "5m")
            self.entries[(org, hashes[bp])] = self.clock() + wire.TTL_S[ttl]
        w5 = w1 = 0
        if eligible:
            last = eligible[-1]
            written = max(0, sums[last + 1] - read)
            if blocks[last][1]["cache_control"].get("ttl", "5m") == "1h":
                w1 = written
            else:
                w5 = written
        total = sums[-1]
        return {"input_tokens": total - read - w5 - w1, "cache_creation_input_tokens": w5 + w1,
                "cache_read_input_tokens": read,
                "cache_creation": {"ephemeral_5m_input_tokens": w5,
                                   "ephemeral_1h_input_tokens": w1},
                "output_tokens": out}


def breakpoints(body: dict) -> Iterator[dict]:
    for t in body.get("tools") or []:
        if t.get("cache_control"):
            yield t
    system = body.get("system")
    for b in system if isinstance(system, list) else []:
        if b.get("cache_control"):
            yield b
    for m in body.get("messages", []):
        for b in m["content"] if isinstance(m["content"], list) else []:
            if b.get("cache_control"):
                yield b
