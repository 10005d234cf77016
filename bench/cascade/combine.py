"""The combined cascade: a prompt score skips the edge on obviously hard prompts, confidence decides the rest.

Rule: a request whose prompt keep score is below `skip_below` goes straight to the cloud (no edge attempt:
no edge CPU, no added latency); every other request goes to the edge and is kept when its confidence is at
or above the cascade threshold. As one keep score: -inf for skipped prompts, the confidence otherwise.

Its parameters (which prompt signal, which confidence signal, which share of prompts to skip) are chosen on
the calibration half only, by APGR there; the evaluation half scores the result. Skipping can only help
quality where the prompt score finds wrong edge answers that confidence misses (MMLU, where the edge model
guesses "A" with some confidence, is the case to expect); its sure gain is cost: skipped requests spend no
edge time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bench.cascade.metrics import apgr

__all__ = ["SKIP_SHARES", "Combination", "choose"]

SKIP_SHARES = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5)


@dataclass(frozen=True)
class Combination:
    prompt_signal: str
    confidence_signal: str
    skip_share: float  # share of calibration prompts skipped (ties at the cut are not)
    skip_below: float  # prompt keep score below which the edge is skipped (-inf: never)
    calibration_apgr: float

    def score(self, prompt_keep: np.ndarray, confidence_keep: np.ndarray) -> np.ndarray:
        return np.where(prompt_keep < self.skip_below, -np.inf, confidence_keep)

    def skipped(self, prompt_keep: np.ndarray) -> np.ndarray:
        return prompt_keep < self.skip_below


def choose(prompt: Mapping[str, np.ndarray], confidence: Mapping[str, np.ndarray], edge_right: np.ndarray,
           cloud_right: np.ndarray, calib: np.ndarray, skip_shares: Sequence[float] = SKIP_SHARES) -> Combination:
    """The best (prompt signal, confidence signal, skip share) by APGR on the calibration indices `calib`.

    Ties keep the first found: the smallest skip share, signals in the order given."""
    best: Combination | None = None
    e, c = edge_right[calib], cloud_right[calib]
    for conf_name, conf in confidence.items():
        for prompt_name, p in prompt.items():
            pc = p[calib]
            for share in skip_shares:
                skip_below = float(np.quantile(pc, share, method="lower")) if share > 0 else -np.inf
                actual = float((pc < skip_below).mean())  # ties at the cut stay on the edge
                cand = Combination(prompt_name, conf_name, actual, skip_below, 0.0)
                value = apgr(cand.score(pc, conf[calib]), e, c)
                if best is None or value > best.calibration_apgr + 1e-12:
                    best = Combination(prompt_name, conf_name, actual, skip_below, value)
    assert best is not None
    return best
