"""The second check before a semantic hit is served (DESIGN: a cosine threshold alone is unsafe).

Sentence embeddings score "Is A faster than B?" and "Is B faster than A?" at 0.99, a
question and its negation above 0.9, and "... a soft yolk?" against "... a hard yolk?"
above 0.95. A list of word classes (negations, antonyms, units) only catches the words
someone thought of, so ``LexicalVerifier`` asks a general question instead: does every
word that carries content appear on both sides, in the same order?

Both texts are normalised (lowercase, contractions spelt out: "isn't" is "is not";
hyphens and thousands separators dropped; number words are digits), split into words,
numbers and symbols (``%``, ``$``, ...), and every token except the :data:`GRAMMAR`
words (articles and the auxiliaries that only shape a question: "How *do* I ..." /
"How *can* I ...") is a content word. The pair is rejected when

| reason    | what differs                                                                |
|-----------|-----------------------------------------------------------------------------|
| numbers   | the multiset of numbers                                                     |
| words     | a content word on one side has no counterpart on the other; a counterpart   |
|           | is the same word, or (with word vectors) a variant of it: a shared prefix   |
|           | of at least 60% of the shorter word and word-vector cosine >= 0.85          |
|           | (colour/color, charge/charging; not hot/cold, Monday/Tuesday, heated/       |
|           | unheated)                                                                   |
| order     | the content words both sides hold once appear in another order (roles       |
|           | swapped: "A pays B" / "B pays A"; "not" may move)                           |

It knows no synonyms, so it also rejects true paraphrases that use other words (the
price of precision: ``benchmarks/gateway/RESULTS.md`` has the false-hit and paraphrase
rates on a held-out set). ``Verifier`` is the interface for a stronger check (a
cross-encoder, or the upstream model itself).
"""
from __future__ import annotations

import re
import threading
import unicodedata
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from prefixcache.gateway.semantic.embedder import Embedder

# Words that only carry a question's grammar: articles, and present-tense auxiliaries
# ("How do I ...", "How can I ...", "Is it ..."). Tense (was, did, will) and modality
# (should, must, may) are content: they change the answer.
GRAMMAR = frozenset("a an the am is are be do does can could please".split())
NEGATION = "not"  # the one content word allowed to move ("isn't X" / "is X not")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60",
                      "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100",
                      "thousand": "1000", "million": "1000000", "billion": "1000000000"})
_CONTRACTIONS = [(re.compile(p), r) for p, r in (
    (r"\bcan't\b", "can not"), (r"\bcannot\b", "can not"), (r"\bwon't\b", "will not"),
    (r"\bshan't\b", "shall not"), (r"\bain't\b", "is not"), (r"n't\b", " not"),
    (r"'re\b", " are"), (r"'m\b", " am"), (r"'ve\b", " have"), (r"'ll\b", " will"),
    (r"'d\b", " would"), (r"'s\b", ""))]
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[^\W\d_]+(?:[-'][^\W\d_]+)*|[^\w\s]")
_PUNCT = frozenset(".,;:!?\"'()[]{}-")
WORD_COSINE = 0.85        # two variants of one word: cosine of their word vectors
WORD_PREFIX = 0.6         # ... and a shared prefix of this share of the shorter word
_WORD_CACHE = 4096


@dataclass(frozen=True)
class Verdict:
    """Outcome of a second check: ``ok`` serves the hit; ``reason`` names the failed check."""

    ok: bool
    reason: str = ""


class Verifier(Protocol):
    """Decides whether the answer cached for ``cached`` may answer ``query``."""

    def check(self, query: str, cached: str) -> Verdict:
        """Compare the two texts -> ``Verdict``; must never raise for any str input."""
        ...


class AcceptAll:
    """No second check (threshold only): for calibration baselines, never the default."""

    def check(self, query: str, cached: str) -> Verdict:
        return Verdict(True)


def _number(token: str) -> str:
    if "," in token and re.fullmatch(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?", token):
        token = token.replace(",", "")
    whole, _, frac = token.partition(".")
    whole = whole.lstrip("0") or "0"
    frac = frac.rstrip("0")
    return f"{whole}.{frac}" if frac else whole


def tokens(text: str) -> list[str]:
    """The normalised tokens of ``text``: lowercase words (hyphens dropped), numbers as
    digits, symbols; contractions spelt out; punctuation dropped."""
    text = unicodedata.normalize("NFKC", text).lower().replace("\u2019", "'")
    for pattern, repl in _CONTRACTIONS:
        text = pattern.sub(repl, text)
    out = []
    for t in _TOKEN.findall(text):
        if t[0].isdigit():
            out.append(_number(t))
        elif t in _PUNCT:
            continue
        else:
            t = t.replace("-", "").replace("'", "")
            out.append(_NUMBER_WORDS.get(t, t))
    return out


def content_words(text: str) -> list[str]:
    """``tokens(text)`` without the :data:`GRAMMAR` words, in order."""
    return [t for t in tokens(text) if t not in GRAMMAR]


def _is_number(t: str) -> bool:
    return t[0].isdigit()


class LexicalVerifier:
    """Rejects a pair unless both sides hold the same content words in the same order.

    ``word_vectors``: an embedder for single words, to accept spelling and inflection
    variants (None: only identical words match).
    """

    def __init__(self, word_vectors: Embedder | None = None) -> None:
        self.word_vectors = word_vectors
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, query: str, cached: str) -> Verdict:
        """Compare ``query`` with ``cached`` -> ``Verdict`` (reason: the first failed check)."""
        if query == cached:
            return Verdict(True)
        a, b = content_words(query), content_words(cached)
        if Counter(filter(_is_number, a)) != Counter(filter(_is_number, b)):
            return Verdict(False, "numbers")
        only_a = list((Counter(a) - Counter(b)).elements())
        only_b = list((Counter(b) - Counter(a)).elements())
        if len(only_a) != len(only_b):
            return Verdict(False, "words")
        renamed = self._pair(only_a, only_b)
        if renamed is None:
            return Verdict(False, "words")
        b = [renamed.get(w, w) for w in b]
        if Counter(a) != Counter(b):  # a word twice on one side, its variants once each
            return Verdict(False, "words")
        if _order(a, b) != _order(b, a):
            return Verdict(False, "order")
        return Verdict(True)

    def _pair(self, only_a: list[str], only_b: list[str]) -> dict[str, str] | None:
        """A one-to-one matching of ``only_b``'s words to variants in ``only_a`` (as a
        renaming b -> a), or None when some word has no variant."""
        if not only_a:
            return {}
        if self.word_vectors is None:
            return None
        vec = self._embed(sorted(set(only_a) | set(only_b)))
        renamed: dict[str, str] = {}
        free = list(only_a)
        for w in only_b:
            match = next((x for x in free if _variants(x, w, vec)), None)
            if match is None:
                return None
            free.remove(match)
            renamed[w] = match
        return renamed if len(set(renamed.values())) == len(renamed) else None

    def _embed(self, words: list[str]) -> dict[str, np.ndarray]:
        assert self.word_vectors is not None
        with self._lock:
            missing = [w for w in words if w not in self._vectors]
        if missing:
            fresh = self.word_vectors.embed(missing)
            with self._lock:
                for w, v in zip(missing, fresh):
                    self._vectors[w] = v
                while len(self._vectors) > _WORD_CACHE:
                    self._vectors.popitem(last=False)
        with self._lock:
            out = {}
            for w in words:
                v = self._vectors.get(w)
                out[w] = v if v is not None else self.word_vectors.embed([w])[0]
            return out


def _variants(x: str, y: str, vec: dict[str, np.ndarray]) -> bool:
    """Two spellings or inflections of one word: a long shared prefix and close vectors.
    Numbers and symbols are never variants."""
    if not (x[0].isalpha() and y[0].isalpha()):
        return False
    shared = 0
    for cx, cy in zip(x, y):
        if cx != cy:
            break
        shared += 1
    if shared < 3 or shared < WORD_PREFIX * min(len(x), len(y)):
        return False
    return float(np.dot(vec[x], vec[y])) >= WORD_COSINE


def _order(p: list[str], other: list[str]) -> list[str]:
    """The content words ``p`` and ``other`` each hold once (``not`` aside), in ``p``'s
    order."""
    cp, co = Counter(p), Counter(other)
    return [w for w in p if w != NEGATION and cp[w] == 1 and co[w] == 1]
