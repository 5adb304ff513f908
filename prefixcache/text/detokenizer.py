"""Streaming detokenization: text deltas that are final as tokens arrive.

Decoding token by token is wrong for two reasons: a character may span several byte-level
tokens (decoding a part gives U+FFFD), and SentencePiece-style decoders strip a leading
space from the start of whatever they decode. So each push decodes a short window twice,
``ids[prefix:read]`` (already emitted) and ``ids[prefix:]``, and emits the difference, and
holds text back while it ends in an incomplete character.
"""
from __future__ import annotations

from prefixcache.text.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 5  # prompt tokens kept as left context for the first delta


class IncrementalDetokenizer:
    """Turns a stream of generated token ids into text deltas.

    Args:
        tokenizer: the model's tokenizer.
        prompt_ids: the prompt; its last few tokens give the first generated token its
            correct leading space. Not part of the output.
        skip_special_tokens: drop special tokens from the text.

    Attributes:
        text: all text emitted so far (concatenation of the deltas).
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int] | None = None,
                 skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:]) if prompt_ids else []
        self._prefix = 0               # window start: left context for decoding
        self._read = len(self._ids)    # tokens up to here are already emitted
        self.text = ""

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=self._skip)

    def push(self, new_token_ids: list[int]) -> str:
        """Add generated tokens; return the newly final text (possibly ``""`` while a
        multi-byte character is incomplete)."""
        self._ids.extend(new_token_ids)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) <= len(before) or after.endswith(_REPLACEMENT):
            return ""
        delta = after[len(before):]
        self._prefix, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """Text still held back at the end of the stream (an incomplete character comes
        out as U+FFFD). Call once, when generation is finished."""
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        delta = after[len(before):] if len(after) > len(before) else ""
        self._prefix = self._read = len(self._ids)
        self.text += delta
        return delta
