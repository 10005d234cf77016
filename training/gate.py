"""The gate: base against base+adapter in llama.cpp, the artifact the fleet runs, on held-out and regression sets.

Answers are greedy chat completions checked against the expected answer by `core.answers.agrees`: a short answer
by its number, option letter or the words it adds to the question (so "The country is Slovakia." is right for
"Slovakia"), a long one by being the same once normalised. Comparing whole answers scored a model that answers in
sentences 0 on a regression set of bare names and numbers, whatever it knew. A candidate is promoted only if it beats the base on the held-out slice by at least
`margin` points and loses at most `max_regression` points on the regression set; otherwise the verdict says why.

Tested in `tests/training/test_gate.py`, `tests/training/test_pipeline.py`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from llama_cpp import Llama

from tiergate.core.answers import agrees
from tiergate.training.data import Example

__all__ = ["Score", "Verdict", "decide", "evaluate"]


@dataclass(frozen=True, slots=True)
class Score:
    correct: int
    total: int

    @property
    def points(self) -> float:
        """Accuracy in percentage points (0 for an empty set)."""
        return 100.0 * self.correct / self.total if self.total else 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    promote: bool
    reason: str
    heldout: dict[str, Score]
    regression: dict[str, Score]
    margin: float
    max_regression: float

    def as_dict(self) -> dict[str, Any]:
        def side(d: dict[str, Score]) -> dict[str, Any]:
            return {k: {**asdict(v), "points": round(v.points, 2)} for k, v in d.items()}

        return {"promote": self.promote, "reason": self.reason, "heldout": side(self.heldout),
                "regression": side(self.regression), "margin": self.margin, "max_regression": self.max_regression}


def evaluate(model: Path, examples: list[Example], lora: Path | None = None, max_tokens: int = 32,
             threads: int = 1) -> Score:
    """Greedy answers of `model` (with `lora` applied) checked against each example's expected answer."""
    if not examples:
        return Score(0, 0)
    llm = Llama(model_path=str(model), lora_path=str(lora) if lora else None, n_ctx=1024, n_threads=threads,
                n_threads_batch=threads, verbose=False, seed=0)
    try:
        correct = 0
        for ex in examples:
            out = llm.create_chat_completion(messages=ex.chat, temperature=0.0, max_tokens=max_tokens)  # type: ignore[arg-type]
            text = out["choices"][0]["message"]["content"] or ""  # type: ignore[index]
            correct += agrees(ex.prompt_text, text, ex.answer)  # a right answer in a sentence counts
        return Score(correct, len(examples))
    finally:
        llm.close()


def decide(heldout: dict[str, Score], regression: dict[str, Score], margin: float, max_regression: float) -> Verdict:
    """Promote when `candidate` beats `base` by `margin` points held out and loses at most `max_regression`."""
    gain = heldout["candidate"].points - heldout["base"].points
    loss = regression["base"].points - regression["candidate"].points
    if heldout["candidate"].total == 0:
        promote, reason = False, "no held-out examples to judge the candidate on"
    elif gain < margin:
        promote, reason = False, f"held-out gain {gain:+.1f} points is below the margin of {margin:g}"
    elif loss > max_regression:
        promote, reason = False, f"regression set lost {loss:.1f} points, more than the {max_regression:g} allowed"
    else:
        promote, reason = True, f"held-out gain {gain:+.1f} points, regression set change {-loss:+.1f} points"
    return Verdict(promote, reason, heldout, regression, margin, max_regression)
