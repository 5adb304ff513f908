"""Turn a :class:`~prefixcache.bench.workloads.BenchRequest` into the exact prompt every
peer receives.

The bench renders chat messages with the model's own chat template once, on the client
side, and sends every peer the same text (``/v1/completions``) or the same token ids
(offline), so all peers prefill the same tokens whatever their chat-template support.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prefixcache.bench.workloads import BenchRequest
from prefixcache.text.loading import tokenizer_for_model
from prefixcache.text.tokenizer import Tokenizer


@dataclass
class Prompt:
    text: str | None  # None when the prompt exists only as token ids
    token_ids: list[int]


class Renderer(Protocol):
    def render(self, req: BenchRequest) -> Prompt: ...


class TokenizerRenderer:
    """Renders with the model's tokenizer (:mod:`prefixcache.text`): its chat template,
    then its ids without added special tokens (the template writes any BOS itself)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> TokenizerRenderer:
        """The tokenizer of a Hugging Face model directory.

        Raises: FileNotFoundError if the directory holds no tokenizer files."""
        tok = tokenizer_for_model(model_dir)
        if tok is None:
            raise FileNotFoundError(f"no tokenizer files in {model_dir}")
        return cls(tok)

    def render(self, req: BenchRequest) -> Prompt:
        if isinstance(req.prompt, list):
            return Prompt(None, list(req.prompt))
        if req.prompt is not None:
            text = req.prompt
        elif req.messages is None:
            raise ValueError(f"request {req.id}: needs messages or a prompt")
        else:
            text = self.tokenizer.render_chat(req.messages, tools=req.tools or None,
                                              add_generation_prompt=True)
        return Prompt(text, self.tokenizer.encode(text, add_special_tokens=False))




def label_warm_by_overlap(reqs: list[BenchRequest], prompts: dict[str, Prompt],
                          threshold: float = 0.5) -> None:
    """For requests without a structural label: warm when an earlier request of the same
    tenant shares at least ``threshold`` of its prompt tokens as a common prefix."""
    earlier: dict[Any, list[list[int]]] = {}
    for r in reqs:
        ids = prompts[r.id].token_ids
        prev = earlier.setdefault(r.tenant, [])
        if r.warm_expected is None:
            best = max((len(os.path.commonprefix([ids, p])) for p in prev), default=0)
            r.warm_expected = bool(ids) and best >= threshold * len(ids)
        prev.append(ids)
