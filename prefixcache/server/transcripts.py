"""The token ids of recent chat transcripts, so that an agent's next call repeats its
previous call's tokens exactly (DESIGN: the transcript's pages hit).

A model's reply is not always the tokenization its tokenizer would give the same text
(a model may write ``g`` ``et`` where the tokenizer writes ``get``, and a grammar lets
it). Re-encoding the next request's rendered prompt would then diverge from the cached
pages at the first such token. So each finished chat request records its transcript:
the rendered prompt text plus the reply text, and the ids the engine actually computed
(the prompt's ids, then the reply's ids up to, not including, a final stop token). A
new chat prompt whose text starts with a recorded transcript takes that transcript's
ids, and only the rest of its text is encoded.

Records are kept per namespace (tenant and ``cache_salt``: one tenant's transcripts
never shape another's tokens), least recently used first out, within a bound on the
tokens held (stored as 32-bit arrays). A reply is recorded only when its ids decode to
exactly its text (so a reply cut by a stop string, or one with special tokens dropped
from its text, is not).
"""
from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Hashable

DEFAULT_MAX_TOKENS = 4_000_000     # all records together (16 MB of ids)
MAX_PER_NAMESPACE = 64


class TranscriptTokens:
    """Recorded transcripts: ``(namespace, text) -> ids``. Thread-safe."""

    def __init__(self, max_tokens: int = DEFAULT_MAX_TOKENS,
                 max_per_namespace: int = MAX_PER_NAMESPACE):
        self.max_tokens = max_tokens
        self.max_per_namespace = max_per_namespace
        self._records: OrderedDict[tuple[Hashable, str], array] = OrderedDict()
        self._by_ns: dict[Hashable, OrderedDict[str, None]] = {}
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0

    def __len__(self) -> int:
        return len(self._records)

    def record(self, namespace: Hashable, text: str, ids: list[int]) -> None:
        """Keep ``ids`` as the tokens of ``text`` in ``namespace``."""
        if not text or not ids or len(ids) > self.max_tokens:
            return
        with self._lock:
            key = (namespace, text)
            if key in self._records:
                self._drop(key)
            self._records[key] = array("i", ids)
            self._tokens += len(ids)
            texts = self._by_ns.setdefault(namespace, OrderedDict())
            texts[text] = None
            while len(texts) > self.max_per_namespace:
                self._drop((namespace, next(iter(texts))))
            while self._tokens > self.max_tokens:
                self._drop(next(iter(self._records)))

    def encode(self, namespace: Hashable, text: str,
               encode: Callable[[str], list[int]]) -> list[int]:
        """The ids of ``text``: the longest recorded transcript of ``namespace`` that
        ``text`` starts with, then ``encode`` of the rest (all of ``text`` when none)."""
        best = ""
        with self._lock:
            for t in self._by_ns.get(namespace, ()):
                if len(t) > len(best) and text.startswith(t):
                    best = t
            if best:
                key = (namespace, best)
                self._records.move_to_end(key)
                self._by_ns[namespace].move_to_end(best)
                head = self._records[key].tolist()
                self.hits += 1
        if not best:
            return encode(text)
        return head + (encode(text[len(best):]) if len(text) > len(best) else [])

    def _drop(self, key: tuple[Hashable, str]) -> None:
        ids = self._records.pop(key)
        self._tokens -= len(ids)
        texts = self._by_ns.get(key[0])
        if texts is not None:
            texts.pop(key[1], None)
            if not texts:
                del self._by_ns[key[0]]
