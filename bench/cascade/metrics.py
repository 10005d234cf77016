"""Scoring a cascade signal: AUROC, the share kept on the edge at a quality loss, APGR, bootstrap intervals.

Conventions, used everywhere in bench/cascade:
- a signal is a "keep score": higher means keep the edge's answer; a cascade with threshold t keeps every
  request whose score is >= t and escalates the rest to the cloud. -inf means "always escalate" (an answer cut
  at max_tokens, a prompt the policy skips the edge for).
- quality of a cascade = mean correctness of the answer each request ends with (the edge's if kept, the
  cloud's if escalated); the loss is all-cloud quality minus that, in absolute points (0.05 = 5 %).
- requests with equal scores move together: no threshold separates them, so none is claimed.
APGR reuses complexity/train.py's definition (../shared/data/README.md): weak = edge only, strong = all cloud,
escalating the lowest keep scores first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tiergate.complexity.apgr import apgr as _apgr

__all__ = ["KeptAtLoss", "apgr", "auroc", "bootstrap_ci", "kept_at_loss", "at_threshold"]


def _finite(score: np.ndarray) -> np.ndarray:
    """-inf -> one below the smallest finite score (a tie group), so sorting and differences stay well defined."""
    score = np.asarray(score, np.float64)
    finite = score[np.isfinite(score)]
    low = (finite.min() - 1.0) if finite.size else 0.0
    return np.where(np.isneginf(score), low, score)


def auroc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counted half; nan without both classes."""
    s, pos = _finite(score), np.asarray(positive, bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]  # average 1-based rank of each tie group
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


@dataclass(frozen=True)
class KeptAtLoss:
    kept: float  # share of requests kept on the edge
    loss: float  # all-cloud quality minus the cascade's
    threshold: float  # keep when score >= threshold (+inf: keep nothing)


def kept_at_loss(score: np.ndarray, edge_right: np.ndarray, cloud_right: np.ndarray, max_loss: float) -> KeptAtLoss:
    """The largest share kept on the edge, over all thresholds, whose quality loss is at most `max_loss`."""
    s = _finite(score)
    n = len(s)
    order = np.argsort(-s, kind="stable")
    harm = (np.asarray(cloud_right, np.float64) - np.asarray(edge_right, np.float64))[order]  # cost of keeping
    cum = np.r_[0.0, np.cumsum(harm)] / n
    s_sorted = s[order]
    ends = np.r_[np.nonzero(np.diff(s_sorted))[0] + 1, n]  # keep the first `end` (whole tie groups)
    ok = ends[cum[ends] <= max_loss + 1e-12]
    if ok.size == 0:
        return KeptAtLoss(0.0, 0.0, float("inf"))
    end = int(ok.max())
    return KeptAtLoss(end / n, float(cum[end]), float(np.asarray(score, np.float64)[order[end - 1]]))


def at_threshold(score: np.ndarray, edge_right: np.ndarray, cloud_right: np.ndarray,
                 threshold: float) -> tuple[float, float]:
    """(share kept, quality loss) of the cascade that keeps score >= threshold."""
    keep = np.asarray(score, np.float64) >= threshold
    harm = np.asarray(cloud_right, np.float64) - np.asarray(edge_right, np.float64)
    return float(keep.mean()), float((harm * keep).sum() / len(keep))


def apgr(score: np.ndarray, edge_right: np.ndarray, cloud_right: np.ndarray) -> float:
    """Mean PGR over escalation shares 0..1, lowest keep score escalated first; nan when edge = cloud quality."""
    weak, strong = np.asarray(edge_right, np.float64), np.asarray(cloud_right, np.float64)
    if abs(strong.mean() - weak.mean()) < 1e-12:
        return float("nan")
    return _apgr(-_finite(score), weak, strong)


def bootstrap_ci(stat: Callable[[np.ndarray], float], n: int, reps: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile interval of `stat(indices)` over `reps` resamples (with replacement) of n items; nan skipped."""
    rng = np.random.default_rng(seed)
    vals = np.array([stat(rng.integers(0, n, n)) for _ in range(reps)])
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1 - a))
