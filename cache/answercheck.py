"""Do two short answers to one question say the same thing? Exact rules anyone can redo, before any embedding.

`AnswerCheck` compares an answer under test (`cached`: a cache candidate, the edge's draft) with a reference answer
(`fresh`: what a tier answered, the cloud's answer) in this order:

- a short answer (a number, a name, an option letter): `core.answers.short_verdict`;
- anything longer goes to the `fallback` judge (`cache.judge`: the embedder or an operator's model), and without
  one gives no verdict. An empty answer gives none either: there is nothing to compare.

The reference is taken as right: the verdict is whether the answer under test agrees with it.

Tested in `tests/cache/test_answercheck.py`.
"""

from __future__ import annotations

from tiergate.cache.judge import Judge
from tiergate.core.answers import SHORT_WORDS, short_verdict

__all__ = ["AnswerCheck"]


class AnswerCheck:
    """A `cache.judge.Judge`: the exact rules for short answers, `fallback` for the rest."""

    def __init__(self, fallback: Judge | None = None, short_words: int = SHORT_WORDS) -> None:
        self.fallback = fallback
        self.short_words = short_words

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        short = short_verdict(question, cached, fresh, self.short_words)
        if short is not None or not cached.strip() or not fresh.strip():
            return short
        return await self.fallback.same(question, cached, fresh) if self.fallback is not None else None
