"""Does an answer agree with a reference answer to the same question? Exact rules anyone can redo.

An embedding cannot tell "4" from "5", or "Canberra" from "Sydney or Canberra"; for a short answer (a number, a
name, an option letter) a rule can, and a rule errs in ways one can read. The reference is taken as right:

- a choice question (the question lists options "A." / "B)" on their own lines) whose reference names a letter:
  the first standalone option letter of each must be the same;
- a reference that commits to one number once the question's own numbers are set aside: the numbers of the
  answer, less one occurrence of each number of the question (restating "7 + 8" is not an answer) as long as
  one is left, must all equal it ("7 + 8 = 15" agrees with "15"; "15 or 16" does not);
- a short reference (at most `short_words` words): the words each answer adds to the question, less a few
  function words, after `normalise` (case, accents, punctuation), must be the same set ("The capital of France
  is Paris." agrees with "Paris"; "Sydney or Canberra" does not with "Canberra").

The cache's judge (`cache.answercheck`), the distillation gate (`training.gate`) and the gateway's rollout probes
(`gateway.rollout`) share them, so a right answer in a sentence counts as right wherever answers are compared.

Tested in `tests/cache/test_answercheck.py` (the rules) and `tests/training/test_gate.py`.
"""

from __future__ import annotations

import collections
import re
import unicodedata

__all__ = ["SHORT_WORDS", "agrees", "choice_question", "first_letter", "normalise", "numbers", "short_verdict"]

_NUMBER = re.compile(r"(?<![\d.])-?\d{1,3}(?:,\d{3})+(?![\d,])|(?<![\d.])-?\d+")
_LETTER = re.compile(r"(?<![A-Za-z0-9])([A-J])(?![A-Za-z0-9])")
_OPTION = re.compile(r"^\s*\(?([A-J])[.)]\s", re.MULTILINE)
_DROP = re.compile(r"['’`.]")
_NON_WORD = re.compile(r"[^a-z0-9]+")
# Words an answer adds to the question without saying anything of its own ("The answer is: Paris.").
_FILLER = frozenset({"a", "an", "the", "is", "are", "was", "it", "its", "of", "to", "in", "answer", "answers",
                     "final", "this", "that", "be", "called", "named", "known", "as", "city", "country", "nation"})
SHORT_WORDS = 8


def normalise(text: str) -> str:
    """Lower case, accents stripped, apostrophes and dots dropped ("D.C." -> "dc"), other punctuation -> space."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    return " ".join(_NON_WORD.sub(" ", _DROP.sub("", text)).split())


def numbers(text: str) -> list[int]:
    """The integers written in digits in `text`, in order ("1,234" is one number)."""
    return [int(m.replace(",", "")) for m in _NUMBER.findall(text)]


def first_letter(answer: str, letters: str = "ABCD") -> str | None:
    """The first standalone capital option letter among `letters` in the answer, if any."""
    for m in _LETTER.finditer(answer):
        if m.group(1) in letters:
            return m.group(1)
    return None


def choice_question(question: str) -> str:
    """The option letters a question lists on their own lines ("A. ...", "B) ..."); "" when it lists none."""
    found = "".join(dict.fromkeys(_OPTION.findall(question)))
    return found if len(found) >= 2 else ""


def _new_numbers(text: str, question: list[int]) -> list[int]:
    """The numbers of `text` less one occurrence of each of the question's, unless that would leave none ("2" is
    an answer to "2 * 1", "2 * 1 = 2" too)."""
    found = numbers(text)
    have, removed = collections.Counter(found), collections.Counter[int]()
    left = len(found)
    for n in question:  # linear: a prompt of many numbers is no quadratic cost
        if left <= 1:
            break
        if have[n] > removed[n]:
            removed[n] += 1
            left -= 1
    out = []
    for n in found:  # the first occurrences are the ones removed
        if removed[n]:
            removed[n] -= 1
        else:
            out.append(n)
    return out


def _new_words(text: str, question: set[str]) -> set[str]:
    return {w for w in normalise(text).split() if w not in question and w not in _FILLER}


def short_verdict(question: str, answer: str, reference: str, short_words: int = SHORT_WORDS) -> bool | None:
    """Whether `answer` agrees with the short `reference` by the exact rules; None: not a short reference (or an
    empty answer), the rules cannot tell."""
    if not answer.strip() or not reference.strip():
        return None
    letters = choice_question(question)
    if letters and (ref_letter := first_letter(reference, letters)) is not None:
        return first_letter(answer, letters) == ref_letter
    asked = numbers(question)
    ref_numbers = set(_new_numbers(reference, asked))
    if len(ref_numbers) == 1:
        found = _new_numbers(answer, asked)
        return bool(found) and all(n in ref_numbers for n in found)
    if ref_numbers or len(normalise(reference).split()) > short_words:
        return None
    words = set(normalise(question).split())
    ref_words = _new_words(reference, words)
    if not ref_words:
        return None  # the reference only restates the question: nothing to hold the answer to
    return _new_words(answer, words) == ref_words


def agrees(question: str, answer: str, reference: str) -> bool:
    """`short_verdict` where the rules can tell; else the two answers equal once normalised (a long reference
    with no judge at hand: only the same answer counts)."""
    verdict = short_verdict(question, answer, reference)
    return verdict if verdict is not None else bool(answer.strip()) and normalise(answer) == normalise(reference)
