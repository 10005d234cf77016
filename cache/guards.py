"""Cheap vetoes against the semantic-cache false hits that embeddings cannot see.

Sentence embeddings put "convert a string to an integer" and "convert an integer to a string" at cosine
~0.99, and "best rehab in Boone County" next to "best rehab in Garland County". Each guard compares one
surface signal of the stored prompt and the new one and vetoes the hit when they disagree:

- numbers: the numbers mentioned (digits or number words) differ ("2015" vs "2016", "five" vs "three");
- negation: one side is negated and the other is not;
- keywords: a name-like token (Capitalised mid-sentence, ACRONYM, or containing digits/symbols such as
  C#, X7, .exe) on one side has no counterpart on the other;
- order: both sides use the same content words but in a different order (who/what relates to what);
- opposites: a word on one side is the opposite of a word only the other side has ("maximum" / "minimum",
  "legal" / "illegal", "before" / "after" meals, "ascending" / "descending"), from WordNet (`cache.lexicon`).
  Embeddings put such pairs at cosine 0.95-0.99, and a cache that answers a dosage question with its
  opposite is a safety defect, not a recall trade-off: this guard is on whatever it costs in recall (measured
  in docs/benchmarks.md).

They run only on the few nearest candidates, in microseconds. Which guards are on by default was chosen on
the calibration half of the labelled pairs (see bench/cache and docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from tiergate.cache.lexicon import Lexicon, lexicon

__all__ = ["GUARDS", "Signature", "overlap", "signature", "veto"]

GUARDS = ("numbers", "negation", "keywords", "order", "opposites")

# Words, keeping C++ / C# / F# whole (a + or # right after letters) and contractions ("don't").
_WORD = re.compile(r"[^\W\d_][^\W_]*[+#]+|[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?")
_NAMEISH = re.compile(r"(?:[^\W\d_]*\d[\w]*|[\w]*[+#]+|\.[a-z0-9]{2,5}\b)", re.UNICODE)
_SENTENCE_ENDS = frozenset('.!?:;\n"“(')

_NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40,
    "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100, "thousand": 1000,
    "million": 10**6, "billion": 10**9, "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5,
    "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9, "tenth": 10, "half": 0.5, "twice": 2, "double": 2,
    "triple": 3, "dozen": 12,
}
_NEGATIONS = frozenset(
    ["not", "no", "never", "nor", "none", "nobody", "nothing", "neither", "nowhere", "without", "cannot", "cant", "dont", "doesnt", "didnt", "isnt", "arent", "wasnt", "werent", "wont", "wouldnt", "shouldnt", "couldnt", "hasnt", "havent", "hadnt", "mustnt"]
)
_STOP = frozenset(
    ["a", "an", "the", "and", "or", "but", "if", "so", "as", "at", "by", "for", "with", "about", "against", "between", "into", "through", "during", "before", "after", "above", "below", "to", "from", "up", "down", "in", "out", "on", "off", "over", "under", "again", "further", "then", "once", "here", "there", "when", "where", "why", "how", "what", "which", "who", "whom", "whose", "this", "that", "these", "those", "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "doing", "have", "has", "had", "having", "i", "me", "my", "myself", "we", "our", "ours", "ourselves", "you", "your", "yours", "yourself", "yourselves", "he", "him", "his", "himself", "she", "her", "hers", "herself", "it", "its", "itself", "they", "them", "their", "theirs", "themselves", "of", "all", "any", "both", "each", "few", "more", "most", "other", "some", "such", "own", "same", "than", "too", "very", "can", "will", "just", "should", "now", "would", "could", "may", "might", "must", "shall", "get", "got", "one", "ones", "someone", "something", "anyone", "anything", "thing", "things", "way", "ways", "really", "also", "please", "there", "s", "t", "d", "ll", "m", "re", "ve", "y"]
)
# Capitalised words that say nothing about *which* thing is meant.
_NOT_NAMES = _STOP | frozenset(["i", "ok", "okay", "yes", "hi", "hello", "thanks", "thank"])


@dataclass(frozen=True, slots=True)
class Signature:
    """The surface facts of one text that the guards compare."""

    numbers: frozenset[float]
    negated: bool
    keywords: frozenset[str]  # lower-cased, stemmed name-like tokens
    words: frozenset[str]  # lower-cased, stemmed tokens (to find a keyword's counterpart)
    content: tuple[str, ...]  # stemmed content words in order, first occurrences only
    forms: frozenset[str]  # every word's base forms, stop words included ("before", "over")
    opposites: dict[str, frozenset[str]]  # each of `forms` that has opposites → them


def _stem(w: str) -> str:
    for suffix in ("ing", "ies", "ed", "es", "s", "'s", "’s"):
        if len(w) > len(suffix) + 2 and w.endswith(suffix):
            return w[: -len(suffix)]
    return w


def _starts_sentence(text: str, pos: int) -> bool:
    i = pos - 1
    while i >= 0 and text[i] in " \t":
        i -= 1
    return i < 0 or text[i] in _SENTENCE_ENDS


def _numbers(text: str, words: Iterable[str]) -> frozenset[float]:
    out: set[float] = set()
    for m in _NUMBER.findall(text):
        try:
            out.add(float(m.replace(",", "")))
        except ValueError:
            continue
    for w in words:
        if w in _NUMBER_WORDS:
            out.add(float(_NUMBER_WORDS[w]))
    return frozenset(out)


def signature(text: str, lex: Lexicon | None = None) -> Signature:
    """`lex`: the opposites' word list (the process's WordNet unless a benchmark compares variants)."""
    lowered = text.lower().replace("n't", " not").replace("n’t", " not")
    tokens = _WORD.findall(lowered)
    words = frozenset(_stem(t) for t in tokens)
    keywords: set[str] = set()
    for m in _WORD.finditer(text):
        tok = m.group(0)
        low = tok.lower()
        if low in _NOT_NAMES:
            continue
        name_like = _NAMEISH.fullmatch(tok) is not None and not tok.isdigit()
        if not name_like and tok[:1].isupper():
            # Capitalised: a name unless it merely starts a sentence (then only ALL-CAPS counts).
            at_start = _starts_sentence(text, m.start())
            name_like = (not at_start) or (len(tok) > 1 and tok.isupper())
        if name_like:
            keywords.add(_stem(low))
    seen: set[str] = set()
    content: list[str] = []
    for t in tokens:
        s = _stem(t)
        if t in _STOP or t in _NEGATIONS or t in _NUMBER_WORDS or t.isdigit() or s in seen:
            continue
        seen.add(s)
        content.append(s)
    lex = lex or lexicon()
    forms = frozenset().union(*(lex.forms(t) for t in set(tokens)))
    return Signature(
        numbers=_numbers(text, tokens),
        negated=any(t in _NEGATIONS for t in tokens),
        keywords=frozenset(keywords),
        words=words,
        content=tuple(content),
        forms=forms,
        opposites={f: o for f in forms if (o := lex.opposites(f))},
    )


def _order_differs(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Same content words (at least two) in a different relative order."""
    if len(a) < 2 or set(a) != set(b):
        return False
    return a != b


def _opposed(a: Signature, b: Signature) -> bool:
    """A word only `a` has is the opposite of a word only `b` has. Words both sides use say nothing: "legal or
    illegal" against "illegal or legal" is one question, and so is "advantages and disadvantages" against
    "advantages" as far as this guard can tell (the word both have is not opposed to the one only `a` has)."""
    only_a, only_b = a.forms - b.forms, b.forms - a.forms
    return (any(not a.opposites.get(w, frozenset()).isdisjoint(only_b) for w in only_a)
            or any(not b.opposites.get(w, frozenset()).isdisjoint(only_a) for w in only_b))  # "unsafe" → "safe" only


def overlap(a: Signature, b: Signature) -> float:
    """The share of content words two texts have in common (Jaccard), 1.0 when neither has any: where the error
    bound keeps its separate cutoffs (`cache.errbound`)."""
    x, y = set(a.content), set(b.content)
    return len(x & y) / len(x | y) if x or y else 1.0


def veto(a: Signature, b: Signature, enabled: Iterable[str] = GUARDS) -> str | None:
    """The first enabled guard that says `a` and `b` ask different things, or None."""
    for guard in enabled:
        if guard == "numbers" and a.numbers != b.numbers:
            return guard
        if guard == "negation" and a.negated != b.negated:
            return guard
        if guard == "keywords" and (a.keywords - b.words or b.keywords - a.words):
            return guard
        if guard == "order" and _order_differs(a.content, b.content):
            return guard
        if guard == "opposites" and _opposed(a, b):
            return guard
    return None
