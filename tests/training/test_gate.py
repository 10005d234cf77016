"""The gate's decision: promoted only past the margin on held-out and within the regression allowance."""

from __future__ import annotations

from tiergate.edge_node.model.packaged import packaged_path
from tiergate.training.data import Example
from tiergate.training.gate import Score, decide, evaluate


def _d(base: int, cand: int, reg_base: int, reg_cand: int, margin: float = 5, max_reg: float = 2):
    return decide({"base": Score(base, 100), "candidate": Score(cand, 100)},
                  {"base": Score(reg_base, 50), "candidate": Score(reg_cand, 50)}, margin, max_reg)


def test_a_candidate_past_the_margin_without_regression_is_promoted() -> None:
    v = _d(30, 60, 40, 40)
    assert v.promote and "+30.0" in v.reason
    assert v.as_dict()["heldout"]["candidate"] == {"correct": 60, "total": 100, "points": 60.0}


def test_too_small_a_gain_is_refused_with_the_reason() -> None:
    v = _d(30, 34, 40, 40)
    assert not v.promote and "below the margin of 5" in v.reason


def test_a_regression_beyond_the_allowance_is_refused_even_with_a_gain() -> None:
    v = _d(30, 90, 40, 38)  # 40/50 -> 38/50: 4 points lost
    assert not v.promote and "lost 4.0 points" in v.reason
    assert _d(30, 90, 40, 39).promote  # 2 points: within the allowance


def test_no_heldout_examples_is_no_promotion() -> None:
    v = decide({"base": Score(0, 0), "candidate": Score(0, 0)}, {"base": Score(1, 1), "candidate": Score(1, 1)},
               margin=-100, max_regression=100)
    assert not v.promote and "no held-out" in v.reason


def test_a_right_answer_in_a_sentence_is_scored_right_in_llama_cpp() -> None:
    """The packaged SmolLM2 answers in sentences; the expected answers are bare names, as a regression set's are.
    Compared whole, both would score 0 whatever the model knows; checked by `core.answers.agrees`, only the
    right one counts."""
    model = packaged_path("smollm2-135m-instruct")  # installed by scripts/setup.sh --dev; missing is a failure
    question = (("user", "Which city is the capital of France?"),)  # "The capital of France is Paris."
    assert evaluate(model, [Example(question, "Paris", 1)], max_tokens=24) == Score(1, 1)
    assert evaluate(model, [Example(question, "Rome", 1)], max_tokens=24) == Score(0, 1)
