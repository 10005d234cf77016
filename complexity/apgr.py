"""How well a score routes: APGR, as ../shared/data/README.md defines it, with fractional labels allowed.

Sweep the threshold from "nothing escalates" to "everything escalates", highest scores first; at each point
the quality is the mean label of the model each prompt was sent to (a judge score in [0, 1] works as well as
right/wrong), and PGR = (quality - weak-only quality) / (strong-only quality - weak-only quality). APGR is the
mean PGR over the escalated share 0..100 % (random = 0.5). Prompts with equal scores escalate together, so
inside a tie the curve is the straight line a random order would give on average.
"""

from __future__ import annotations

import numpy as np

__all__ = ["apgr", "apgr_resampled", "pgr_curve", "share_for_pgr"]


def pgr_curve(score: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(share escalated, PGR) at every distinct threshold, highest scores escalated first."""
    score = np.asarray(score, np.float64)
    n = len(score)
    order = np.argsort(-score, kind="stable")
    s = score[order]
    gain = (strong - weak)[order]
    bounds = np.r_[0, np.nonzero(np.diff(s))[0] + 1, n]
    cum = np.r_[0.0, np.cumsum(gain)]
    q_weak, q_strong = weak.mean(), strong.mean()
    quality = (weak.sum() + cum[bounds]) / n
    return bounds / n, (quality - q_weak) / (q_strong - q_weak)


def apgr(score: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> float:
    """Average performance gap recovered over escalation shares 0..100 % (random = 0.5)."""
    x, y = pgr_curve(score, weak, strong)
    return float(np.trapezoid(y, x))


def apgr_resampled(score: np.ndarray, weak: np.ndarray, strong: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """APGR of one ranking on many resamples at once; `counts` is [B, n]: how often each prompt was drawn.

    The same sweep as `apgr` (a resample with every count 1 gives exactly `apgr`), vectorised for a bootstrap."""
    order = np.argsort(-np.asarray(score, np.float64), kind="stable")
    s, c = np.asarray(score, np.float64)[order], counts[:, order].astype(np.float64)
    bounds = np.r_[0, np.nonzero(np.diff(s))[0] + 1, len(s)]
    n = c.sum(1, keepdims=True)
    share = np.c_[np.zeros(len(c)), np.cumsum(c, 1)][:, bounds] / n
    gained = np.c_[np.zeros(len(c)), np.cumsum(c * (strong - weak)[order], 1)][:, bounds] / n
    gap = (c * strong[order]).sum(1, keepdims=True) / n - (c * weak[order]).sum(1, keepdims=True) / n
    pgr = gained / gap
    area: np.ndarray = np.sum((share[:, 1:] - share[:, :-1]) * (pgr[:, 1:] + pgr[:, :-1]) / 2, 1)
    return area


def share_for_pgr(score: np.ndarray, weak: np.ndarray, strong: np.ndarray, target: float) -> float:
    """Smallest share of escalated prompts at which PGR reaches `target` (interpolated)."""
    x, y = pgr_curve(score, weak, strong)
    for i in range(1, len(x)):
        if y[i] >= target:
            if y[i] == y[i - 1]:
                return float(x[i])
            return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
    return 1.0
