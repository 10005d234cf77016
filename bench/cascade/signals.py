"""The keep scores compared by bench/cascade, each computed the way the product computes it.

Answer signals come from policies/confidence.py (`confidence` over the answer's TokenScores), prompt signals
from policies/classify.py's Classifier (the gateway's own prompt token count, in the edge model's tokenizer
under the default policy, and the complexity score), so the bench measures the code that routes.

Which design each signal belongs to decides whether the cut rule applies:
- "hold": the whole edge answer is read before deciding (mean, minimum, margin). An answer cut at max_tokens
  escalates whatever its confidence (a rule the cascade has anyway), so its score is -inf.
- "first-k": decided on the first k tokens while the answer streams on; the end of the answer is unknown, so
  no cut rule.
- "prompt": decided before the edge is asked (higher complexity / longer prompt = less likely to keep).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bench.cascade.runner import Answer
from bench.report import REPO
from tiergate.core.types import Priority
from tiergate.core.wire import decode_chat
from tiergate.policies.classify import Classifier
from tiergate.policies.confidence import confidence
from tiergate.policies.loader import load_policy

__all__ = ["DESIGN", "FIRST_K", "PromptFeatures", "answer_signals", "prompt_features"]

FIRST_K = (1, 3, 5)
DESIGN: dict[str, str] = {
    "mean logprob": "hold", "min logprob": "hold", "mean margin": "hold",
    **{f"first-{k} mean logprob": "first-k" for k in FIRST_K},
    "finished (not cut)": "hold",
    "prompt tokens": "prompt", "complexity": "prompt",
}
DEFAULT_POLICY = REPO / "policies" / "default.yaml"


def _cut(a: Answer) -> bool:
    return a.finish_reason == "length"


def answer_signals(answers: Sequence[Answer], cut_rule: bool = True) -> dict[str, np.ndarray]:
    """Keep scores from the edge answers; `cut_rule=False` gives the hold signals without the cut rule."""
    out: dict[str, list[float]] = {name: [] for name, d in DESIGN.items() if d != "prompt"}
    for a in answers:
        c = confidence(a.scores)
        hold_cut = cut_rule and _cut(a)
        out["mean logprob"].append(-math.inf if hold_cut else c.mean_logprob)
        out["min logprob"].append(-math.inf if hold_cut else c.min_logprob)
        margin = c.mean_margin if c.mean_margin is not None else -math.inf
        out["mean margin"].append(-math.inf if hold_cut else margin)
        for k in FIRST_K:
            out[f"first-{k} mean logprob"].append(confidence(a.scores, first_k=k).mean_logprob)
        out["finished (not cut)"].append(0.0 if _cut(a) else 1.0)
    return {k: np.array(v) for k, v in out.items()}


class PromptFeatures:
    """Prompt tokens and complexity of chat prompts, by the gateway's Classifier under a policy."""

    def __init__(self, policy_file: Path = DEFAULT_POLICY) -> None:
        policy = load_policy(policy_file)

        class _Store:
            current = type("Active", (), {"policy": policy})()

        self._clf = Classifier(_Store())
        self.policy_file = policy_file

    def __call__(self, prompt: str) -> tuple[int, float]:
        req = decode_chat(json.dumps({"model": "auto", "messages": [{"role": "user", "content": prompt}]}).encode())
        f = self._clf.features(req, "bench", Priority.NORMAL, {})
        return f.prompt_tokens, f.complexity


def prompt_features(prompts: Sequence[str], policy_file: Path = DEFAULT_POLICY) -> dict[str, np.ndarray]:
    """Keep scores from the prompts alone: minus the prompt tokens, minus the complexity score."""
    feats = PromptFeatures(policy_file)
    rows = [feats(p) for p in prompts]
    return {"prompt tokens": -np.array([r[0] for r in rows], np.float64),
            "complexity": -np.array([r[1] for r in rows], np.float64)}
