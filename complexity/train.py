"""Training and scoring the complexity model (`tiergate classifier train`), reproducibly.

Input is labelled routing data in the format of ../shared/data/routing/mmlu_dev.jsonl: one JSON object per
line with `prompt`, `weak_correct`, `strong_correct`. The target is the gain of escalating,
strong_correct - weak_correct (in {-1, 0, 1}): its conditional mean is what routing should rank by, and unlike
the binary "only the strong model is right" label it also learns from prompts that escalation would spoil.

The default model (`target="gain"`) averages two estimates of that conditional mean, each turned into a
percentile of its training predictions first (a rank average):
- "gain": one tree ensemble fitted to strong_correct - weak_correct;
- "strong-weak": one ensemble fitted to strong_correct minus one fitted to weak_correct (stored as a single
  ensemble whose second half has its leaf values negated).
Both use the same tree settings (DEFAULT_PARAMS). On subjects held out of training the average ranks better
than either alone (bench/router, docs/benchmarks.md). `target="escalate"` trains one ensemble on the binary
"only the strong model is right" label instead.

The features are `complexity.model.FEATURES`, computed by the same `Featurizer` the gateway uses; two of them
(option similarity) read the shipped word vectors `complexity/word_vectors.npy`, built once from all-MiniLM-L6-v2
by `tiergate classifier vectors`; the model records their sha256 and the gateway refuses a model trained
with other vectors.

Training needs scikit-learn (a training-only dependency); the result is exported to plain arrays and the
gateway scores with numpy alone. Same data and parameters give the same file, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from complexity.model import FEATURES, ComplexityModel, Featurizer, Member, TreeEnsemble

__all__ = [
    "DEFAULT_PARAMS",
    "Labelled",
    "Target",
    "apgr",
    "fit",
    "fit_trees",
    "pgr_curve",
    "read_labelled",
    "share_for_pgr",
    "train",
]

Target = Literal["gain", "escalate"]
DEFAULT_PARAMS: dict[str, Any] = {
    "max_iter": 150,
    "learning_rate": 0.05,
    "max_leaf_nodes": 4,
    "min_samples_leaf": 80,
    "l2_regularization": 0.0,
    "random_state": 0,
}


@dataclass(frozen=True)
class Labelled:
    prompts: list[str]
    weak: np.ndarray  # float 0/1
    strong: np.ndarray
    errors: list[tuple[int, str]]  # (line number, why it was skipped)
    sha256: str  # of the file's bytes, recorded in the model

    def target(self, kind: Target) -> np.ndarray:
        if kind == "gain":
            return self.strong - self.weak
        return ((self.strong == 1) & (self.weak == 0)).astype(np.float64)


def read_labelled(path: Path | str, lines: Iterable[str] | None = None) -> Labelled:
    """Read labelled prompts; malformed lines are skipped and reported, never fatal."""
    raw = Path(path).read_bytes() if lines is None else "".join(lines).encode()
    prompts: list[str] = []
    weak: list[float] = []
    strong: list[float] = []
    errors: list[tuple[int, str]] = []
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            errors.append((n, f"not JSON: {exc}"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            errors.append((n, 'expected an object with a string "prompt"'))
            continue
        w, s = obj.get("weak_correct"), obj.get("strong_correct")
        if not isinstance(w, bool) or not isinstance(s, bool):
            errors.append((n, '"weak_correct" and "strong_correct" must be true or false'))
            continue
        prompts.append(obj["prompt"])
        weak.append(float(w))
        strong.append(float(s))
    return Labelled(prompts, np.asarray(weak), np.asarray(strong), errors, hashlib.sha256(raw).hexdigest())


# ------------------------------------------------------------------------------------------- scoring


def pgr_curve(score: np.ndarray, weak: np.ndarray, strong: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(share escalated, PGR) at every distinct threshold, highest scores escalated first.

    Prompts with equal scores are escalated together, so between two thresholds the curve is the straight
    line a random order inside the tie would give on average (a constant score scores exactly 0.5).
    """
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


def share_for_pgr(score: np.ndarray, weak: np.ndarray, strong: np.ndarray, target: float) -> float:
    """Smallest share of escalated prompts at which PGR reaches `target` (interpolated)."""
    x, y = pgr_curve(score, weak, strong)
    for i in range(1, len(x)):
        if y[i] >= target:
            if y[i] == y[i - 1]:
                return float(x[i])
            return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
    return 1.0


# ------------------------------------------------------------------------------------------ training


def fit_trees(x: np.ndarray, y: np.ndarray, params: dict[str, Any] | None = None) -> TreeEnsemble:
    """Fit scikit-learn's histogram gradient boosting and export it to flat arrays."""
    from sklearn.ensemble import HistGradientBoostingRegressor  # training-only dependency
    from threadpoolctl import threadpool_limits  # installed with scikit-learn

    est = HistGradientBoostingRegressor(early_stopping=False, **{**DEFAULT_PARAMS, **(params or {})})
    with threadpool_limits(1):  # OpenMP on a shared 2-core machine thrashes; one thread is fast and steady
        est.fit(x, y)
    return _export(est)


def _export(est: Any) -> TreeEnsemble:
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


def _calibration(raw: np.ndarray, points: int = 201) -> tuple[np.ndarray, np.ndarray]:
    """Monotone map raw → share of training prompts scoring at most that (ties get their mid-rank)."""
    levels = np.linspace(0.0, 1.0, points)
    qs = np.quantile(raw, levels)
    xs, inverse = np.unique(qs, return_inverse=True)
    ys = np.array([levels[inverse == k].mean() for k in range(len(xs))])
    if len(xs) == 1:
        xs, ys = np.array([xs[0] - 1e-9, xs[0] + 1e-9]), np.array([0.0, 1.0])
    return xs, ys


def _negate_and_join(plus: TreeEnsemble, minus: TreeEnsemble) -> TreeEnsemble:
    """One ensemble predicting plus(x) - minus(x): the trees of both, the second's leaf values negated."""
    off = len(plus.feature)
    return TreeEnsemble(np.r_[plus.feature, minus.feature].astype(np.int32), np.r_[plus.threshold, minus.threshold],
                        np.r_[plus.left, minus.left + off].astype(np.int32),
                        np.r_[plus.right, minus.right + off].astype(np.int32), np.r_[plus.value, -minus.value],
                        np.r_[plus.roots, minus.roots + off].astype(np.int32), max(plus.depth, minus.depth),
                        plus.baseline - minus.baseline)


def _member(x: np.ndarray, trees: TreeEnsemble, target: str) -> tuple[Member, np.ndarray]:
    raw = np.array([trees.predict(row) for row in x])
    cal_raw, cal_score = _calibration(raw)
    member = Member(trees, cal_raw, cal_score, target)
    return member, np.interp(raw, cal_raw, cal_score)


def fit(x: np.ndarray, weak: np.ndarray, strong: np.ndarray, target: Target = "gain",
        params: dict[str, Any] | None = None, featurizer: Featurizer | None = None,
        meta: dict[str, Any] | None = None) -> ComplexityModel:
    """The complexity model for feature matrix `x` and its labels (what `train` and bench/router fit)."""
    if target == "gain":
        specs = [(fit_trees(x, strong - weak, params), "gain"),
                 (_negate_and_join(fit_trees(x, strong, params), fit_trees(x, weak, params)), "strong-weak")]
    else:
        specs = [(fit_trees(x, ((strong == 1) & (weak == 0)).astype(np.float64), params), "escalate")]
    members, percentiles = zip(*(_member(x, trees, name) for trees, name in specs), strict=True)
    combined = np.mean(percentiles, axis=0)
    cal_raw, cal_score = _calibration(combined)
    return ComplexityModel(tuple(members), cal_raw, cal_score, dict(meta or {}), featurizer or Featurizer())


def train(data: Labelled, target: Target = "gain", params: dict[str, Any] | None = None,
          featurizer: Featurizer | None = None, source: str = "") -> ComplexityModel:
    """Train on all of `data`; the model records what it was trained on and how."""
    feats = featurizer or Featurizer()
    x = feats.matrix(data.prompts)
    model = fit(x, data.weak, data.strong, target, params, feats)
    combined = np.array([model.combined(row) for row in x])
    meta = {
        "data": {"source": source, "sha256": data.sha256, "rows": len(data.prompts),
                 "skipped_lines": len(data.errors)},
        "target": target,
        "members": [m.target for m in model.members],
        "params": {**DEFAULT_PARAMS, **(params or {})},
        "trees": sum(len(m.trees.roots) for m in model.members),
        "in_sample_apgr": round(apgr(combined, data.weak, data.strong), 4),
        "features": list(FEATURES),
    }
    return ComplexityModel(model.members, model.calibration_raw, model.calibration_score, meta, feats)
