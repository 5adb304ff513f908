"""A bare ``tokenizer.json`` through the ``tokenizers`` library (no transformers import,
fast offsets and batches). Chat template and special-token strings from the optional
config files beside it (:mod:`.tokenizer_files`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefixcache.text.tokenizer import Offsets, Tokenizer
from prefixcache.text.tokenizer_files import (
    folder_chat_template,
    folder_template_tokens,
    generation_eos_ids,
)

_SENTENCEPIECE_SPACE = "\u2581"


class JSONTokenizer(Tokenizer):
    """``tokenizers.Tokenizer.from_file`` over ``path`` (a ``tokenizer.json`` or the
    folder holding it).

    Args:
        bos_token_id: from ``config.json`` (``tokenizer.json`` has no such field).
        eos_token_ids: from ``config.json``; ``generation_config.json`` ids are added.

    Raises (constructor): FileNotFoundError if there is no ``tokenizer.json``; Exception
    from ``tokenizers`` if it does not parse.
    """

    def __init__(self, path: str | Path, bos_token_id: int | None = None,
                 eos_token_ids: set[int] | frozenset[int] | tuple[int, ...] = frozenset()):
        from tokenizers import Tokenizer as RawTokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path}")
        folder = file.parent
        self._tok = RawTokenizer.from_file(str(file))
        self.name = folder.name
        self.bos_token_id = bos_token_id
        self.eos_token_ids = set(eos_token_ids) | generation_eos_ids(folder)
        self._special = {i: t.content for i, t in self._tok.get_added_tokens_decoder().items()
                         if t.special}
        self.chat_template = folder_chat_template(folder)
        self._template_vars = folder_template_tokens(folder)
        for key, tid in (("bos_token", self.bos_token_id),
                         ("eos_token", min(self.eos_token_ids, default=None))):
            if tid is not None and key not in self._template_vars:
                self._template_vars[key] = self._tok.id_to_token(tid) or ""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_offsets(self, text: str,
                       add_special_tokens: bool = True) -> tuple[list[int], Offsets]:
        enc = self._tok.encode(text, add_special_tokens=add_special_tokens)
        return list(enc.ids), list(enc.offsets)

    def encode_batch(self, texts: list[str],
                     add_special_tokens: bool = True) -> list[list[int]]:
        return [list(e.ids) for e in
                self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self) -> Any:
        """The ``tokenizers.Tokenizer`` itself (the grammar engine reads its vocabulary)."""
        return self._tok

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._special)

    @property
    def template_vars(self) -> dict[str, str]:
        return dict(self._template_vars)

    def decode_token(self, token_id: int) -> str:
        text = self.decode([token_id], skip_special_tokens=False)
        piece = self._tok.id_to_token(token_id)
        if piece and piece.startswith(_SENTENCEPIECE_SPACE) and not text.startswith(" "):
            text = " " + text
        return text
