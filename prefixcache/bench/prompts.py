"""Turn a :class:`~prefixcache.bench.workloads.BenchRequest` into the exact prompt every
peer receives.

The bench renders chat messages with the model's own chat template once, on the client
side, and sends every peer the same text (``/v1/completions``) or the same token ids
(offline), so all peers prefill the same tokens whatever their chat-template support.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prefixcache.bench.workloads import BenchRequest


@dataclass
class Prompt:
    text: str | None  # None when the prompt exists only as token ids
    token_ids: list[int]


class Renderer(Protocol):
    def render(self, req: BenchRequest) -> Prompt: ...


class HFRenderer:
    """Renders with a Hugging Face tokenizer (``AutoTokenizer`` of the model dir)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> "HFRenderer":
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(model_dir)))

    def render(self, req: BenchRequest) -> Prompt:
        if isinstance(req.prompt, list):
            return Prompt(None, list(req.prompt))
        if req.prompt is not None:
            text = req.prompt
        else:
            text = self.tokenizer.apply_chat_template(req.messages, tools=req.tools or None, tokenize=False,
                                                      add_generation_prompt=True)
        return Prompt(text, list(self.tokenizer.encode(text, add_special_tokens=False)))


class EngineTokenizerRenderer:
    """Renders with prefixcache's own tokenizer (``llm.tokenizer``), for models without a
    Hugging Face directory such as ``builtin:tiny``."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def render(self, req: BenchRequest) -> Prompt:
        if isinstance(req.prompt, list):
            return Prompt(None, list(req.prompt))
        if req.prompt is not None:
            return Prompt(req.prompt, list(self.tokenizer.encode(req.prompt, add_special_tokens=False)))
        if hasattr(self.tokenizer, "render_chat"):
            text = self.tokenizer.render_chat(req.messages, tools=req.tools or None, add_generation_prompt=True)
            return Prompt(text, list(self.tokenizer.encode(text, add_special_tokens=False)))
        ids = self.tokenizer.apply_chat_template(req.messages, tools=req.tools or None, add_generation_prompt=True)
        return Prompt(None, list(ids))


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def label_warm_by_overlap(reqs: list[BenchRequest], prompts: dict[str, Prompt], threshold: float = 0.5) -> None:
    """For requests without a structural label: warm when an earlier request of the same
    tenant shares at least ``threshold`` of its prompt tokens as a common prefix."""
    earlier: dict[Any, list[list[int]]] = {}
    for r in reqs:
        ids = prompts[r.id].token_ids
        prev = earlier.setdefault(r.tenant, [])
        if r.warm_expected is None:
            best = max((common_prefix_len(ids, p) for p in prev), default=0)
            r.warm_expected = bool(ids) and best >= threshold * len(ids)
        prev.append(ids)
