"""The second check before a semantic hit is served (DESIGN: a cosine threshold alone is unsafe).

Sentence embeddings score "Is A faster than B?" and "Is B faster than A?" at 0.99, and a
question and its negation above 0.9. ``LexicalVerifier`` compares the query with the
cached text and rejects the pair when any of these differ:

| check      | what must match                                                            |
|------------|----------------------------------------------------------------------------|
| negation   | whether each side is negated (not, no, never, n't, without, cannot, ...)   |
| numbers    | the multiset of numbers (digits, "1,000", "2.5", number words, ordinals)   |
| entities   | every capitalised word, acronym or token with a digit on one side appears  |
|            | on the other (case-insensitively)                                          |
| opposites  | a word of an antonym pair (before/after, buy/sell, max/min, ...) on one    |
|            | side and its opposite only on the other                                    |
| order      | the entities in another order; or a shared word on the other side of a     |
|            | relation word (than, to, from, vs, over, into, before, after, ...)         |

It is cheap (pure Python, tens of microseconds) and deterministic; it knows no synonyms,
so it also rejects some true paraphrases (the price of precision). ``Verifier`` is the
interface for a stronger check (a cross-encoder, or the upstream model itself).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

_TOKEN = re.compile(r"[A-Za-z0-9]+(?:[.,'][A-Za-z0-9]+)*")
_OR_NOT = re.compile(r"\bor not\b|\bor why not\b", re.IGNORECASE)
NEGATIONS = frozenset(
    "not no never none nobody nothing nowhere neither nor without cannot cant "
    "isnt arent wasnt werent dont doesnt didnt wont wouldnt shouldnt couldnt "
    "hasnt havent hadnt mustnt neednt aint".split())
# "one" is left out: "which one", "no one", "one day" are rarely a count.
NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero _ two three four five six seven eight nine ten eleven twelve thirteen "
    "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()) if w != "_"}
NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60",
                     "seventy": "70", "eighty": "80", "ninety": "90", "hundred": "100",
                     "thousand": "1000", "million": "1e6", "billion": "1e9",
                     "first": "1", "second": "2", "third": "3", "fourth": "4",
                     "fifth": "5", "half": "0.5", "twice": "2", "double": "2"})
OPPOSITES = [tuple(p.split("/")) for p in (
    "before/after above/below buy/sell increase/decrease max/min maximum/minimum "
    "more/less most/least higher/lower high/low faster/slower fast/slow bigger/smaller "
    "larger/smaller big/small cheapest/expensive cheaper/pricier up/down open/close "
    "start/end first/last import/export input/output add/remove enable/disable "
    "true/false in/out on/off win/lose best/worst better/worse old/new older/newer "
    "male/female men/women man/woman upload/download send/receive push/pull "
    "encrypt/decrypt encode/decode positive/negative inside/outside early/late "
    "open/closed keep/stop start/stop include/exclude allow/forbid accept/reject pass/fail "
    "safe/unsafe legal/illegal possible/impossible likely/unlikely agree/disagree "
    "like/dislike").split()]
RELATIONS = frozenset(
    "than to from vs versus over into onto before after by against under above below "
    "beats killed defeated".split())
QUESTION_WORDS = frozenset(
    "what how why when where who whom whose which is are was were do does did can could "
    "should would will shall may might i the a an in on if my your our their".split())
STOPWORDS = QUESTION_WORDS | frozenset(
    "of for and or with at as it its this that these those be been being there here "
    "me we you he she they them his her some any about get".split())


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


@dataclass(frozen=True)
class _Parsed:
    raw: tuple[str, ...]        # tokens as written
    words: tuple[str, ...]      # lowercased, apostrophes dropped
    negated: bool
    numbers: Counter
    entities: frozenset[str]
    content: tuple[str, ...]    # words minus stopwords, in order


def _parse(text: str) -> _Parsed:
    text = _OR_NOT.sub(" ", text.replace("\u2019", "'"))
    raw = tuple(_TOKEN.findall(text))
    words = tuple(t.lower().replace("'", "") for t in raw)
    negated = any(w in NEGATIONS or t.lower().endswith("n't") for t, w in zip(raw, words))
    numbers: Counter = Counter()
    for w in words:
        if w[0].isdigit():
            num = re.sub(r"(?<=\d),(?=\d{3})", "", w)
            m = re.match(r"\d+(?:\.\d+)?", num)
            if m:
                numbers[m.group(0).lstrip("0") or "0"] += 1
        elif w in NUMBER_WORDS:
            numbers[NUMBER_WORDS[w]] += 1
    entities = set()
    for i, (t, w) in enumerate(zip(raw, words)):
        acronym = len(t) >= 2 and t.isupper() and t.isalpha()
        capital = t[0].isupper() and w not in STOPWORDS and (i > 0 or acronym)
        if acronym or capital or (any(c.isdigit() for c in t) and any(c.isalpha() for c in t)):
            entities.add(w)
    content = tuple(w for w in words if w not in STOPWORDS and w not in NEGATIONS)
    return _Parsed(raw, words, negated, numbers, frozenset(entities), content)


def _side_flip(a: _Parsed, b: _Parsed) -> bool:
    """True when a word shared once by both sides sits on opposite sides of a relation word
    (one that occurs once on each side)."""
    for rel in RELATIONS:
        if a.words.count(rel) != 1 or b.words.count(rel) != 1:
            continue
        ia, ib = a.words.index(rel), b.words.index(rel)
        for w in set(a.content) & set(b.content):
            if w == rel or a.words.count(w) != 1 or b.words.count(w) != 1:
                continue
            if (a.words.index(w) < ia) != (b.words.index(w) < ib):
                return True
    return False


def _covered(entities: frozenset[str], words: set[str]) -> bool:
    """Each entity is a word of the other side, or that word plus a suffix of at most 3
    letters, stem 4+ letters (Japan/Japanese, Islam/Islamic; not Java/JavaScript)."""
    return all(e in words or any(_stem_match(e, w) for w in words) for e in entities)


def _stem_match(x: str, y: str) -> bool:
    short, long = (x, y) if len(x) <= len(y) else (y, x)
    return len(short) >= 4 and len(long) - len(short) <= 3 and long.startswith(short)


def _entity_order(p: _Parsed, other: _Parsed) -> tuple[str, ...]:
    """Entities occurring once on each side, in ``p``'s order ("Rome beat Carthage": rome,
    carthage)."""
    shared = (p.entities | other.entities) & set(p.words) & set(other.words)
    return tuple(w for w in p.words
                 if w in shared and p.words.count(w) == 1 and other.words.count(w) == 1)


class LexicalVerifier:
    """Order-, negation-, number-, entity- and antonym-sensitive comparison of two texts."""

    def check(self, query: str, cached: str) -> Verdict:
        """Compare ``query`` with ``cached`` -> ``Verdict`` (reason: the first failed check)."""
        if query == cached:
            return Verdict(True)
        a, b = _parse(query), _parse(cached)
        if a.negated != b.negated:
            return Verdict(False, "negation")
        if a.numbers != b.numbers:
            return Verdict(False, "numbers")
        words_a, words_b = set(a.words), set(b.words)
        if not _covered(a.entities, words_b) or not _covered(b.entities, words_a):
            return Verdict(False, "entities")
        for x, y in OPPOSITES:
            if (x in words_a and y in words_b and y not in words_a and x not in words_b) or (
                    y in words_a and x in words_b and x not in words_a and y not in words_b):
                return Verdict(False, "opposites")
        if _entity_order(a, b) != _entity_order(b, a) or _side_flip(a, b):
            return Verdict(False, "order")
        return Verdict(True)
