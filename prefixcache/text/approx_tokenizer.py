"""``approx``: token counts close to a real BPE tokenizer's, with no file.

The text is split with the Qwen2 pre-tokenizer pattern (the regex byte-level BPE
tokenizers apply before merging) and each piece is cut into chunks of at most 8 UTF-8
bytes; each chunk is one token whose id is a 31-bit BLAKE2b hash of its text. On the
shared agent trajectories and OpenAssistant prompts its counts are within about 5% of
the real Qwen2 tokenizer, so token counts and costs are realistic; token boundaries are
not the real ones, so use a real tokenizer for exact figures. The ChatML markers
``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>`` are single tokens, like Qwen's.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

from prefixcache.text.chat_template import CHATML_SPECIALS
from prefixcache.text.tokenizer import Offsets, Tokenizer

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
APPROX_CHUNK_BYTES = 8
_ID_BITS = 31


class ApproxTokenizer(Tokenizer):
    """Regex pre-tokens cut into chunks of at most ``chunk_bytes`` bytes, one token
    each, id = hash of the chunk text (see the module docstring). It adds no special
    tokens (``add_special_tokens`` changes nothing) and decodes only ids it produced
    (others as U+FFFD).

    Raises (constructor): ValueError naming ``chunk_bytes`` if it is below 4.
    """

    name = "approx"

    def __init__(self, chunk_bytes: int = APPROX_CHUNK_BYTES):
        from tokenizers import Regex, pre_tokenizers  # the Rust regex engine (\p{L})

        if chunk_bytes < 4:
            raise ValueError(f"chunk_bytes must be at least 4 (one UTF-8 character), "
                             f"got {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.eos_token_ids = set()
        self._specials = re.compile("|".join(re.escape(s) for s in CHATML_SPECIALS))
        self._split = pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated")
        self._ids: dict[str, int] = {}
        self._text: dict[int, str] = {}

    def _id(self, chunk: str) -> int:
        i = self._ids.get(chunk)
        if i is None:
            digest = hashlib.blake2b(chunk.encode("utf-8"), digest_size=4).digest()
            i = int.from_bytes(digest, "little") & ((1 << _ID_BITS) - 1)
            self._ids[chunk] = i
            self._text[i] = chunk
        return i

    def _segments(self, text: str) -> Iterator[tuple[int, str, bool]]:
        """``(start, piece, is_special)`` with every ChatML marker on its own."""
        pos = 0
        for m in self._specials.finditer(text):
            if m.start() > pos:
                yield pos, text[pos:m.start()], False
            yield m.start(), m.group(), True
            pos = m.end()
        if pos < len(text):
            yield pos, text[pos:], False

    def _chunks(self, piece: str) -> Iterator[tuple[int, str]]:
        """Cut a piece into runs of whole characters of at most ``chunk_bytes`` bytes."""
        if len(piece.encode("utf-8")) <= self.chunk_bytes:
            yield 0, piece
            return
        start, size = 0, 0
        for j, ch in enumerate(piece):
            n = len(ch.encode("utf-8"))
            if size + n > self.chunk_bytes:
                yield start, piece[start:j]
                start, size = j, 0
            size += n
        yield start, piece[start:]

    def encode_offsets(self, text: str,
                       add_special_tokens: bool = True) -> tuple[list[int], Offsets]:
        ids: list[int] = []
        offs: Offsets = []
        for start, seg, special in self._segments(text):
            if special:
                ids.append(self._id(seg))
                offs.append((start, start + len(seg)))
                continue
            for piece, (a, _b) in self._split.pre_tokenize_str(seg):
                for k, chunk in self._chunks(piece):
                    ids.append(self._id(chunk))
                    offs.append((start + a + k, start + a + k + len(chunk)))
        return ids, offs

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # the same ids as encode_offsets, with a fast path for pieces seen before
        ids: list[int] = []
        known, new_id, limit = self._ids, self._id, self.chunk_bytes
        for _, seg, special in self._segments(text):
            if special:
                ids.append(known.get(seg) or new_id(seg))
                continue
            for piece, _ in self._split.pre_tokenize_str(seg):
                i = known.get(piece)
                if i is not None:
                    ids.append(i)
                elif len(piece) <= limit // 4 or len(piece.encode("utf-8")) <= limit:
                    ids.append(new_id(piece))
                else:
                    ids.extend(known.get(c) or new_id(c) for _, c in self._chunks(piece))
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self._text
        if skip_special_tokens:
            return "".join(text.get(i, "\ufffd") for i in ids if text.get(i) not in
                           CHATML_SPECIALS)
        return "".join(text.get(i, "\ufffd") for i in ids)

    @property
    def vocab_size(self) -> int:
        return 1 << _ID_BITS

    @property
    def all_special_ids(self) -> list[int]:
        return sorted(self._id(s) for s in CHATML_SPECIALS)
