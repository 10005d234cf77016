"""Gradient-boosted regression trees as plain arrays, scored without scikit-learn (the multiple-choice expert's).

Training uses scikit-learn's histogram gradient boosting (a training-only dependency, the `dev` extra); the
fitted trees are exported to flat arrays, stored as JSON, and compiled at load into one Python expression of
nested conditionals (only the model's numbers go into it), which evaluates 450 small trees in a few
microseconds: numpy's per-call cost on a 27-number vector would dominate. Training scores with the same
code, so the numbers are identical.

Tested in `tests/complexity/test_choice.py`.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_PARAMS", "PercentileMap", "TreeEnsemble", "calibration", "fit_trees", "interp", "negate_and_join"]

DEFAULT_PARAMS: dict[str, Any] = {
    "max_iter": 150,
    "learning_rate": 0.05,
    "max_leaf_nodes": 4,
    "min_samples_leaf": 80,
    "l2_regularization": 0.0,
    "random_state": 0,
}


@dataclass(frozen=True)
class TreeEnsemble:
    """Regression trees as flat arrays; a leaf points to itself, so every row walks the same number of steps."""

    feature: np.ndarray  # int32, per node
    threshold: np.ndarray  # float64, go left when x[feature] <= threshold
    left: np.ndarray  # int32, global node index
    right: np.ndarray  # int32
    value: np.ndarray  # float64, leaf values (shrinkage included)
    roots: np.ndarray  # int32, one per tree
    depth: int
    baseline: float

    def __post_init__(self) -> None:
        self._compiled  # compile at load, not on the first request  # noqa: B018

    def predict(self, x: Sequence[float]) -> float:
        return float(self._compiled(x))

    @functools.cached_property
    def _compiled(self) -> Callable[[Sequence[float]], float]:
        """The trees as one function `x -> baseline + sum of leaf values`, built from the arrays' numbers only."""
        feature, threshold = self.feature.tolist(), self.threshold.tolist()
        left, right, value = self.left.tolist(), self.right.tolist(), self.value.tolist()

        def tree(node: int) -> str:
            if left[node] == node:  # a leaf points to itself
                return repr(float(value[node]))
            return (f"({tree(left[node])} if x[{int(feature[node])}] <= {float(threshold[node])!r} "
                    f"else {tree(right[node])})")

        terms = [repr(float(self.baseline))] + [tree(int(root)) for root in self.roots.tolist()]
        namespace: dict[str, Any] = {}
        # A tuple summed, not `a + b + ...`: a chain of hundreds of additions nests as deep in the compiler.
        exec(compile("def predict(x):\n    return sum((" + ", ".join(terms) + ",))\n", "<tree-ensemble>", "exec"),
             namespace)
        predict: Callable[[Sequence[float]], float] = namespace["predict"]
        return predict

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature.tolist(), "threshold": self.threshold.tolist(), "left": self.left.tolist(),
                "right": self.right.tolist(), "value": self.value.tolist(), "roots": self.roots.tolist(),
                "depth": self.depth, "baseline": self.baseline}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TreeEnsemble:
        return cls(np.asarray(d["feature"], np.int32), np.asarray(d["threshold"], np.float64),
                   np.asarray(d["left"], np.int32), np.asarray(d["right"], np.int32),
                   np.asarray(d["value"], np.float64), np.asarray(d["roots"], np.int32), int(d["depth"]),
                   float(d["baseline"]))


def interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """`numpy.interp(x, xs, ys)` for one value, by the same formula, without numpy's per-call cost."""
    if x < xs[0]:
        return float(ys[0])
    j = bisect.bisect_right(xs, x) - 1
    if j >= len(xs) - 1:
        return float(ys[-1])
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return float(slope * (x - xs[j]) + ys[j])


class PercentileMap:
    """A calibration curve: increasing raw values and the share of reference prompts at or below each."""

    __slots__ = ("raw", "score")

    def __init__(self, raw: Iterable[float], score: Iterable[float]) -> None:
        self.raw, self.score = [float(v) for v in raw], [float(v) for v in score]

    def __call__(self, value: float) -> float:
        return interp(self.raw, self.score, value)


def calibration(raw: np.ndarray, points: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """Monotone map raw → share of training prompts scoring at most that (ties get their mid-rank)."""
    levels = np.linspace(0.0, 1.0, points)
    qs = np.quantile(raw, levels)
    xs, inverse = np.unique(qs, return_inverse=True)
    ys = np.array([levels[inverse == k].mean() for k in range(len(xs))])
    if len(xs) == 1:
        xs, ys = np.array([xs[0] - 1e-9, xs[0] + 1e-9]), np.array([0.0, 1.0])
    return xs, ys


# ------------------------------------------------------------------------------------------ training


def fit_trees(x: np.ndarray, y: np.ndarray, params: dict[str, Any] | None = None) -> TreeEnsemble:
    """Fit scikit-learn's histogram gradient boosting and export it to flat arrays."""
    from sklearn.ensemble import HistGradientBoostingRegressor  # training-only dependency (dev extra)
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    est = HistGradientBoostingRegressor(early_stopping=False, **{**DEFAULT_PARAMS, **(params or {})})
    with threadpool_limits(1):  # OpenMP on a shared 2-core machine thrashes; one thread is fast and steady
        est.fit(x, y)
    return export(est)


def export(est: Any) -> TreeEnsemble:
    """A fitted HistGradientBoostingRegressor's trees as a TreeEnsemble."""
    feature: list[int] = []
    threshold: list[float] = []
    left: list[int] = []
    right: list[int] = []
    value: list[float] = []
    roots: list[int] = []
    depth = 0
    for iteration in est._predictors:
        (pred,) = iteration
        nodes = pred.nodes
        if bool(np.any(nodes["is_categorical"])):
            raise ValueError("categorical splits are not supported by the exporter")
        base = len(feature)
        roots.append(base)
        for i, node in enumerate(nodes):
            if node["is_leaf"]:
                feature.append(0)
                threshold.append(0.0)
                left.append(base + i)
                right.append(base + i)
                value.append(float(node["value"]))
            else:
                feature.append(int(node["feature_idx"]))
                threshold.append(float(node["num_threshold"]))
                left.append(base + int(node["left"]))
                right.append(base + int(node["right"]))
                value.append(0.0)
            depth = max(depth, int(node["depth"]))
    baseline = float(np.asarray(est._baseline_prediction).ravel()[0])
    return TreeEnsemble(np.asarray(feature, np.int32), np.asarray(threshold, np.float64),
                        np.asarray(left, np.int32), np.asarray(right, np.int32), np.asarray(value, np.float64),
                        np.asarray(roots, np.int32), depth, baseline)


def negate_and_join(plus: TreeEnsemble, minus: TreeEnsemble) -> TreeEnsemble:
    """One ensemble predicting plus(x) - minus(x): the trees of both, the second's leaf values negated."""
    off = len(plus.feature)
    return TreeEnsemble(np.r_[plus.feature, minus.feature].astype(np.int32), np.r_[plus.threshold, minus.threshold],
                        np.r_[plus.left, minus.left + off].astype(np.int32),
                        np.r_[plus.right, minus.right + off].astype(np.int32), np.r_[plus.value, -minus.value],
                        np.r_[plus.roots, minus.roots + off].astype(np.int32), max(plus.depth, minus.depth),
                        plus.baseline - minus.baseline)
