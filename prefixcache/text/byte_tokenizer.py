"""One token per UTF-8 byte (ids 0-255), then a list of special tokens (ids 256...).

Exact and dependency-free, about 3-4x more tokens than a BPE tokenizer. Used by the
builtin model (its own special tokens and chat template) and by ``--tokenizer bytes``
in analyze (the ChatML markers, :func:`chatml_byte_tokenizer`).
"""
from __future__ import annotations

import re

from prefixcache.text.chat_template import CHATML_SPECIALS
from prefixcache.text.tokenizer import Offsets, Tokenizer


class ByteTokenizer(Tokenizer):
    """Byte-level tokenizer: ids 0-255 are the UTF-8 bytes, ``special_tokens[k]`` is id
    ``256 + k``; ids from there up to ``vocab_size`` pad the vocabulary and decode to
    nothing.

    ``encode`` maps special-token strings in the text to their ids; with
    ``add_special_tokens`` it prepends ``bos_token`` (when there is one). ``decode``
    replaces invalid UTF-8 with U+FFFD.

    Args:
        special_tokens: the special-token strings, in id order.
        bos_token, eos_tokens: which of them begin a sequence and end generation.
        vocab_size: at least ``256 + len(special_tokens)`` (default: exactly that).
        chat_template: Jinja source, or ``None``.
        name: for reports.

    Raises:
        ValueError: ``vocab_size`` too small, or ``bos_token``/``eos_tokens`` not in
            ``special_tokens`` (the message names the parameter).
    """

    def __init__(self, special_tokens: tuple[str, ...], *, bos_token: str | None = None,
                 eos_tokens: tuple[str, ...] = (), vocab_size: int | None = None,
                 chat_template: str | None = None, name: str = "bytes"):
        self._special_ids = {tok: 256 + k for k, tok in enumerate(special_tokens)}
        self._special_text = {i: t for t, i in self._special_ids.items()}
        used = 256 + len(special_tokens)
        if vocab_size is not None and vocab_size < used:
            raise ValueError(f"vocab_size must be at least {used}, got {vocab_size}")
        for param, toks in (("bos_token", (bos_token,) if bos_token else ()),
                            ("eos_tokens", eos_tokens)):
            missing = [t for t in toks if t not in self._special_ids]
            if missing:
                raise ValueError(f"{param}: {missing} not in special_tokens")
        self._vocab_size = vocab_size or used
        self._bos_text = bos_token
        self._eos_text = eos_tokens[0] if eos_tokens else None
        self.name = name
        self.bos_token_id = self._special_ids[bos_token] if bos_token else None
        self.eos_token_ids = {self._special_ids[t] for t in eos_tokens}
        self.chat_template = chat_template
        self._split = re.compile("(" + "|".join(map(re.escape, special_tokens)) + ")") \
            if special_tokens else None

    def _parts(self, text: str) -> list[str]:
        """Plain text at even indices, special tokens at odd ones."""
        return self._split.split(text) if self._split is not None else [text]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [self.bos_token_id] if add_special_tokens and self.bos_token_id is not None \
            else []
        for k, part in enumerate(self._parts(text)):
            if k % 2:
                ids.append(self._special_ids[part])
            else:
                ids.extend(part.encode("utf-8"))
        return ids

    def encode_offsets(self, text: str,
                       add_special_tokens: bool = True) -> tuple[list[int], Offsets]:
        ids: list[int] = []
        offs: Offsets = []
        if add_special_tokens and self.bos_token_id is not None:
            ids.append(self.bos_token_id)
            offs.append((0, 0))
        pos = 0
        for k, part in enumerate(self._parts(text)):
            if k % 2:
                ids.append(self._special_ids[part])
                offs.append((pos, pos + len(part)))
            else:
                for j, ch in enumerate(part):
                    b = ch.encode("utf-8")
                    ids.extend(b)
                    offs.extend([(pos + j, pos + j + 1)] * len(b))
            pos += len(part)
        return ids, offs

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            if not skip_special_tokens and i in self._special_text:
                out.append(self._special_text[i])
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._special_text)

    @property
    def template_vars(self) -> dict[str, str]:
        return {k: v for k, v in (("bos_token", self._bos_text),
                                  ("eos_token", self._eos_text)) if v}


def chatml_byte_tokenizer() -> ByteTokenizer:
    """``--tokenizer bytes``: bytes plus the ChatML markers ``<|endoftext|>`` (256),
    ``<|im_start|>`` (257), ``<|im_end|>`` (258) as single tokens, like Qwen's."""
    return ByteTokenizer(CHATML_SPECIALS, name="bytes")
