"""The exact short-answer rules: option letters, numbers less the question's own, the words an answer adds; long
answers go to the fallback judge, and an empty one (or a reference that only restates the question) is no verdict."""

from __future__ import annotations

import pytest

from tiergate.cache.answercheck import AnswerCheck
from tiergate.core.answers import agrees, choice_question, first_letter, normalise, numbers, short_verdict

MMLU = "Which is a metal?\nA. iron\nB. water\nC. air\nD. wood\nAnswer with one letter."


def test_the_text_rules():
    assert normalise("Washington, D.C. ") == "washington dc" and normalise("Bogotá") == "bogota"
    assert numbers("1,234 and -5 and 3.5") == [1234, -5, 3]  # digits after a point are no number
    assert first_letter("I think B. or A") == "B" and first_letter("Apples") is None
    assert first_letter("E then C", "ABCDE") == "E" and first_letter("E then C") == "C"
    assert choice_question(MMLU) == "ABCD" and choice_question("What is 2 + 2?") == ""


@pytest.mark.parametrize(("question", "answer", "reference", "expected"), [
    (MMLU, "A. iron", "A", True),
    (MMLU, "The answer is A", "A", True),
    (MMLU, "B", "The answer is A.", False),
    (MMLU, "I do not know", "A", False),  # committed to no option
    ("What is 7 + 8? Answer with one number.", "7 + 8 = 15", "15", True),
    ("What is 7 + 8? Answer with one number.", "15 or 16", "15", False),
    ("What is 7 + 8? Answer with one number.", "The answer is 11.", "15", False),
    ("What is 7 + 8? Answer with one number.", "To solve this we add 7 and 8", "15", False),
    ("What is 2 * 1? Answer with one number.", "2", "2", True),  # the result is one of the question's numbers
    ("What is the capital of France? Answer with one word.", "The capital of France is Paris.", "Paris", True),
    ("What is the capital of France? Answer with one word.", "Paris or Lyon", "Paris", False),
    ("What is the capital of Slovakia?", "Bratisláva", "Bratislava", True),
    ("What is the capital of Ukraine?", "Kiev", "Kyiv", False),
])
def test_short_answers(question, answer, reference, expected):
    assert short_verdict(question, answer, reference) is expected


@pytest.mark.parametrize(("question", "answer", "reference"), [
    ("Explain recursion.", "A function calling itself.", " ".join(["word"] * 30)),  # a long reference
    ("What is the capital of France?", "", "Paris"),  # nothing to compare
    ("Name the capital city of Mexico.", "Mexico City", "Mexico City"),  # the reference only restates
    ("Add 3 and 4 and 5 and 6.", "7", "7 or 11"),  # the reference commits to no one number
])
def test_no_short_verdict(question, answer, reference):
    assert short_verdict(question, answer, reference) is None


class _Judge:
    def __init__(self, verdict: bool | None) -> None:
        self.verdict = verdict
        self.asked: list[tuple[str, str, str]] = []

    async def same(self, question: str, cached: str, fresh: str) -> bool | None:
        self.asked.append((question, cached, fresh))
        return self.verdict


@pytest.mark.anyio
async def test_long_answers_go_to_the_fallback_and_short_ones_never_do():
    long_ref = "Recursion is when a function solves a problem by calling itself on smaller parts of it."
    fallback = _Judge(False)
    check = AnswerCheck(fallback)
    assert await check.same("Explain recursion.", "A function that calls itself.", long_ref) is False
    assert fallback.asked == [("Explain recursion.", "A function that calls itself.", long_ref)]
    assert await check.same("What is 7 + 8?", "15", "15") is True
    assert await check.same("What is 7 + 8?", "", long_ref) is None  # empty: no verdict, not the fallback's
    assert len(fallback.asked) == 1
    assert await AnswerCheck().same("Explain recursion.", "A function that calls itself.", long_ref) is None


@pytest.fixture
def anyio_backend():
    return "asyncio"


def test_agrees_uses_the_rules_and_else_only_the_same_answer():
    """What the distillation gate and the rollout probes score with: a right short answer in a sentence counts,
    a wrong one does not; a long reference counts only an answer that is the same once normalised."""
    assert agrees("Which country has the capital Bratislava?", "The country is Slovakia.", "Slovakia")
    assert not agrees("Which country has the capital Bratislava?", "The country is Slovenia.", "Slovakia")
    assert agrees("What is 7 times 8?", "7 times 8 is 56.", "56")
    assert not agrees("What is 7 times 8?", "", "56")
    long = "Returns are accepted within thirty days of delivery with the original receipt and packaging intact."
    assert agrees("What is the return policy?", long.upper(), long)
    assert not agrees("What is the return policy?", "Returns are accepted within thirty days.", long)
