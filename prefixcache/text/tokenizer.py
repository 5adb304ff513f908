"""The one tokenizer protocol every package uses (engine, server, bench, analyze).

Backends: :class:`~.hf_tokenizer.HFTokenizer` (transformers),
:class:`~.json_tokenizer.JSONTokenizer` (``tokenizer.json`` through the ``tokenizers``
library), :class:`~.byte_tokenizer.ByteTokenizer` and
:class:`~.approx_tokenizer.ApproxTokenizer`; :mod:`.loading` picks one.

Defaults follow the engine: ``encode`` adds the tokenizer's own special tokens
(typically BOS) and ``decode`` drops special tokens. Callers that tokenize a rendered
chat template (which writes BOS itself) pass ``add_special_tokens=False``.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from prefixcache.text import tool_prompt
from prefixcache.text.chat_template import render_chat_template

Offsets = list[tuple[int, int]]  # per token: [start, end) character offsets in the text


class Tokenizer(ABC):
    """Text <-> token ids.

    Attributes:
        name: a short name for reports (``"qwen2"``, ``"bytes"``...).
        eos_token_ids: every id that ends generation (tokenizer EOS, ``config.json`` and
            ``generation_config.json`` ``eos_token_id``).
        bos_token_id: or ``None``.
        chat_template: Jinja source, or ``None`` when there is none.
    """

    name: str = ""
    eos_token_ids: set[int]
    bos_token_id: int | None = None
    chat_template: str | None = None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the tokenizer's own
        additions (typically BOS). Special-token strings in ``text`` map to their ids."""

    @abstractmethod
    def encode_offsets(self, text: str,
                       add_special_tokens: bool = True) -> tuple[list[int], Offsets]:
        """``encode(text)`` and, per token, its ``(start, end)`` character offsets in
        ``text`` (``(0, 0)`` for added tokens and where the backend has no offsets)."""

    def encode_batch(self, texts: list[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        """``[encode(t) for t in texts]`` (backends batch it where they can)."""
        return [self.encode(t, add_special_tokens) for t in texts]

    @abstractmethod
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``. Incomplete UTF-8 at the end shows as U+FFFD."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows (added tokens included)."""

    @property
    @abstractmethod
    def all_special_ids(self) -> list[int]:
        """Ids of special tokens (BOS, EOS, role markers...), sorted."""

    @property
    def template_vars(self) -> dict[str, str]:
        """Special-token strings passed to chat templates (``bos_token``...)."""
        return {}

    def decode_token(self, token_id: int) -> str:
        """Text of one token as it reads inside a sequence (for logprobs'
        ``decoded_token``); special tokens keep their text."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True) -> str:
        """Prompt text of a conversation (OpenAI-style message dicts). Tools and tool
        calls go through :func:`.tool_prompt.prepare` first (a template without tool
        syntax gets the Hermes fallback).

        Raises:
            ValueError: there is no chat template.
            ChatTemplateError: the template fails on this conversation.
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt")
        def render(msgs: list[dict[str, Any]], schemas: Any) -> str:
            return render_chat_template(str(self.chat_template), msgs, schemas,
                                        add_generation_prompt, **self.template_vars)
        return tool_prompt.render_with_fallback(self.chat_template, messages, tools, render)

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation rendered with the chat template (the template
        writes any BOS itself). Raises as :meth:`render_chat`."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt),
                           add_special_tokens=False)
