"""One tokenizer interface over three backends.

* :class:`HFTokenizer`: a Hugging Face directory, through
  ``transformers.AutoTokenizer.from_pretrained(dir, local_files_only=True)`` (offline).
* :class:`JSONTokenizer`: a directory holding only ``tokenizer.json``, through the
  ``tokenizers`` library.
* ``prefixcache.model.builtin.ByteTokenizer``: the builtin model's byte-level tokenizer.
"""
from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from prefixcache.model.chat_template import render_chat_template


class Tokenizer(ABC):
    """Text <-> token ids.

    Attributes:
        eos_token_ids: every id that ends generation (tokenizer EOS, ``config.json`` and
            ``generation_config.json`` ``eos_token_id``).
        bos_token_id: or ``None``.
        chat_template: Jinja source, or ``None`` when the model has none.
    """

    eos_token_ids: set[int]
    bos_token_id: int | None
    chat_template: str | None

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` the tokenizer's own
        additions (typically BOS). Special-token strings in ``text`` map to their ids."""

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
        """Ids of special tokens (BOS, EOS, role markers...)."""

    def decode_token(self, token_id: int) -> str:
        """Text of one token as it reads inside a sequence (for logprobs'
        ``decoded_token``); special tokens keep their text."""
        return self.decode([token_id], skip_special_tokens=False)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                    = None, add_generation_prompt: bool = True) -> str:
        """Prompt text of a conversation. Raises ValueError if there is no chat template."""
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt")
        return render_chat_template(self.chat_template, messages, tools, add_generation_prompt,
                                    **self._template_tokens())

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True) -> list[int]:
        """Token ids of a conversation rendered with the chat template (the template
        writes any BOS itself). Raises ValueError if there is no chat template."""
        return self.encode(self.render_chat(messages, tools, add_generation_prompt),
                           add_special_tokens=False)

    def _template_tokens(self) -> dict[str, str]:
        """Special-token strings passed to chat templates (``bos_token``...)."""
        return {}


class HFTokenizer(Tokenizer):
    """A transformers tokenizer loaded offline from a directory.

    Raises (constructor): OSError/ValueError from transformers if the files are unreadable.
    """

    def __init__(self, path: str | Path, extra_eos_ids: set[int] = frozenset()):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        self.bos_token_id = self._tok.bos_token_id
        eos = self._tok.eos_token_id
        self.eos_token_ids = set(extra_eos_ids) | ({eos} if eos is not None else set())
        template = getattr(self._tok, "chat_template", None)
        self.chat_template = template if isinstance(template, str) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def all_special_ids(self) -> list[int]:
        return list(self._tok.all_special_ids)

    def decode_token(self, token_id: int) -> str:
        text = self.decode([token_id], skip_special_tokens=False)
        piece = self._tok.convert_ids_to_tokens(token_id)
        # SentencePiece pieces start with U+2581 for a space that decode() strips.
        if isinstance(piece, str) and piece.startswith("\u2581") and not text.startswith(" "):
            text = " " + text
        return text

    def render_chat(self, messages, tools=None, add_generation_prompt=True) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt")
        return self._tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt)


class JSONTokenizer(Tokenizer):
    """A bare ``tokenizer.json`` (``tokenizers`` library). Chat template from
    ``chat_template.jinja`` beside it, if any."""

    def __init__(self, path: str | Path, bos_token_id: int | None = None,
                 eos_token_ids: set[int] = frozenset()):
        from tokenizers import Tokenizer as RawTokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        self._tok = RawTokenizer.from_file(str(file))
        self.bos_token_id = bos_token_id
        self.eos_token_ids = set(eos_token_ids)
        self._special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()
                         if t.special}
        jinja = file.parent / "chat_template.jinja"
        self.chat_template = jinja.read_text() if jinja.is_file() else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._special)

    def decode_token(self, token_id: int) -> str:
        text = self.decode([token_id], skip_special_tokens=False)
        piece = self._tok.id_to_token(token_id)
        if piece and piece.startswith("\u2581") and not text.startswith(" "):
            text = " " + text
        return text

    def _template_tokens(self) -> dict[str, str]:
        out = {}
        for name, tid in (("bos_token", self.bos_token_id),
                          ("eos_token", min(self.eos_token_ids, default=None))):
            if tid is not None:
                out[name] = self._tok.id_to_token(tid) or ""
        return out


def _generation_eos(path: Path) -> set[int]:
    file = path / "generation_config.json"
    if not file.is_file():
        return set()
    eos = json.loads(file.read_text()).get("eos_token_id")
    return set(eos) if isinstance(eos, list) else ({eos} if eos is not None else set())


def load_tokenizer(path: str | Path, bos_token_id: int | None = None,
                   eos_token_ids: set[int] | tuple[int, ...] = ()) -> Tokenizer | None:
    """The tokenizer of a model directory, or ``None`` if it holds no tokenizer files.

    ``tokenizer_config.json`` present -> :class:`HFTokenizer`; only ``tokenizer.json`` ->
    :class:`JSONTokenizer`. ``bos_token_id``/``eos_token_ids`` (from ``config.json``)
    complete what the tokenizer files say; ``generation_config.json`` EOS ids are added.
    """
    path = Path(path)
    eos = set(eos_token_ids) | _generation_eos(path)
    if (path / "tokenizer_config.json").is_file():
        tok: Tokenizer = HFTokenizer(path, eos)
        if tok.bos_token_id is None:
            tok.bos_token_id = bos_token_id
        return tok
    if (path / "tokenizer.json").is_file():
        return JSONTokenizer(path, bos_token_id, eos)
    return None
