"""Exact checkers for the edge model's short answers: is this answer right, judged by a rule anyone can redo?

The model is asked for one number, word or letter, but a 135M model often says more ("7 + 8 = 15",
"The capital of Kenya is Nairobi."). Each rule accepts such an answer when, and only when, it commits to
the gold answer and to nothing else:

- numbers (`number_right`): the integers in the answer (digits; thousands commas allowed), less one
  occurrence of each operand of the question (so restating "7 + 8" does not count as an answer), must be at
  least one and all equal the gold. "7 + 8 = 15" is right, "The answer is 11." and "8 + 7 = 15 or 16" are
  wrong, an answer cut off before any result ("To solve this, we need the sum of 8 and") is wrong.
- entities (`entity_right`, capitals and countries): after `normalise` (case, accents, punctuation), the
  answer is scanned for every candidate name of the task (all capitals, or all countries, with their
  accepted aliases), longest first and without overlaps ("South Sudan" is not also "Sudan"). Right when the
  gold entity is found and no other entity is. "Paris.", "The capital of France is Paris." are right;
  "Sydney or Canberra" is wrong.
- letters (`letter_right`, MMLU): the first standalone capital letter A-D in the answer equals the gold.

The text rules themselves (`normalise`, `numbers`, `first_letter`) are the product's (`tiergate.cache.answercheck`),
which judges the edge's answers against the cloud's for the learned router the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from tiergate.core.answers import first_letter, normalise, numbers

__all__ = ["EntityIndex", "entity_right", "first_letter", "letter_right", "normalise", "number_right", "numbers"]


def number_right(answer: str, gold: int, operands: Sequence[int]) -> bool:
    found = numbers(answer)
    for op in operands:
        if op in found:
            found.remove(op)
    return bool(found) and all(n == gold for n in found)


class EntityIndex:
    """Candidate names of one task (entity -> accepted names), matched as whole words, longest first."""

    def __init__(self, names: Mapping[str, Iterable[str]]) -> None:
        self._by_words: dict[tuple[str, ...], str] = {}
        for entity, aliases in names.items():
            for alias in (entity, *aliases):
                key = tuple(normalise(alias).split())
                if key and self._by_words.setdefault(key, entity) != entity:
                    raise ValueError(f"name {alias!r} is ambiguous: {entity} and {self._by_words[key]}")
        self._longest = max(len(k) for k in self._by_words)

    def find(self, text: str) -> set[str]:
        """The entities named in `text` (greedy, longest name first at each position, no overlaps)."""
        words = normalise(text).split()
        found: set[str] = set()
        i = 0
        while i < len(words):
            for size in range(min(self._longest, len(words) - i), 0, -1):
                entity = self._by_words.get(tuple(words[i:i + size]))
                if entity is not None:
                    found.add(entity)
                    i += size
                    break
            else:
                i += 1
        return found


def entity_right(answer: str, gold: str, index: EntityIndex) -> bool:
    return index.find(answer) == {gold}


def letter_right(answer: str, gold: str) -> bool:
    return first_letter(answer) == gold
