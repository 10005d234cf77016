"""Training the learned router (`tiergate classifier train --from-outcomes`): outcome records in, a calibrated
`RouterModel` for one edge model version out.

The fit is an L2-regularised logistic regression solved by Newton's method (a few hundred features: exact, and
deterministic; its strength chosen from a small grid by held-out log loss), whose regulariser pulls the weights
towards a prior instead of towards zero when there is one: after a promotion the new edge model starts from the
previous version's router and moves away from it as its own outcomes accumulate (`prior_strength` is worth that many outcomes of evidence). Calibration is Platt scaling fitted on
cross-fitted (out-of-fold) scores, so the probabilities the policy's `edge_success` thresholds read are honest on
requests the model did not train on; those held-out scores are also what the model's `meta` reports, with a
table of candidate `edge_success.max` values: the share each would send straight to the cloud and the share of the
answers that stood it would send there, so that the condition's cut-off is chosen on held-out predictions.

Records come from a Redis stream (`redis://...`, the gateway's `tiergate:outcomes`) or a JSON-lines file of the
same records.

Tested in `tests/complexity/test_router_train.py`.
"""

from __future__ import annotations

import collections
import json
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis

from tiergate.complexity.edge_router import (
    DENSE,
    FEATURES_VERSION,
    HASH_BUCKETS,
    RouterFeatures,
    RouterModel,
    Vector,
    features_of,
)
from tiergate.complexity.train import one_blas_thread
from tiergate.core.types import Features

__all__ = ["GRADED_SOURCES", "L2_GRID", "MIN_GRADED", "OUTCOMES_STREAM", "Outcomes", "cutoff_table", "fit_router", "outcome_record",
           "read_outcomes"]

OUTCOMES_STREAM = "tiergate:outcomes"
_FOLDS = 5
_BATCH = 1000
# An edge that could not be reached says nothing about the prompt: such records do not train the router.
_NOT_ABOUT_THE_PROMPT = frozenset({"first_tier_failed"})
# Graded labels (was the edge's answer right?): the edge's answer judged against the cloud's in the gateway
# (`gateway.outcomes.OutcomeSource.AGREEMENT`), and graded traffic (`tiergate policy outcomes`).
GRADED_SOURCES = frozenset({"agreement", "graded"})
MIN_GRADED = 200
_MAX_WEIGHT = 50  # a verified kept answer counts at most this many times (router.verify of 2 % and up)  # graded records of a version before training uses them instead of the cascade's verdicts
L2_GRID = (1.0, 3.0, 10.0, 30.0)  # the regularisation strengths tried (held-out log loss picks one)
CUTOFFS = tuple(round(0.05 * i, 2) for i in range(1, 11))  # the edge_success.max values the model's meta rates


def outcome_record(features: Features, *, stood: bool, edge_version: str, tenant: str, rule: str, reason: str,
                   source: str) -> dict[str, Any]:
    """One outcome as the gateway records it and training reads it (no prompt text: the caller adds one only for
    a tenant that opted in)."""
    return {"ts": round(time.time(), 3), "label": int(stood), "edge_version": edge_version, "fv": FEATURES_VERSION,
            "features": features_of(features).to_json(), "tenant": tenant, "rule": rule, "reason": reason,
            "source": source, "prompt_tokens": features.prompt_tokens, "complexity": round(features.complexity, 4)}


@dataclass(slots=True)
class Outcomes:
    """Usable records of one edge model version: features (rows) and labels (1: the edge's answer stood)."""

    x: np.ndarray
    y: np.ndarray
    skipped: int
    versions: dict[str, int]  # every edge version seen -> its records
    labels: str = "all"  # which records were used: "graded" (graded labels alone) or "all"
    graded: int = 0  # agreement records of the chosen version (used or not)


def _records_from_file(path: Path) -> Iterator[Any]:
    with path.open() as f:
        for line in f:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    yield None


def _records_from_redis(url: str, key: str) -> Iterator[Any]:
    client = redis.Redis.from_url(url)
    try:
        start = "-"
        while True:
            batch = client.xrange(key, min=start, max="+", count=_BATCH) or []
            for _entry_id, fields in batch:
                raw = fields.get(b"r") if fields else None
                try:
                    yield json.loads(raw) if raw is not None else None
                except (json.JSONDecodeError, UnicodeDecodeError):
                    yield None
            if len(batch) < _BATCH:
                return
            last = batch[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    finally:
        client.close()


def _records(sources: Iterable[str]) -> Iterator[Any]:
    for source in sources:
        if source.startswith(("redis://", "rediss://", "unix://")):
            yield from _records_from_redis(source, OUTCOMES_STREAM)
        else:
            yield from _records_from_file(Path(source))


def read_outcomes(source: str | list[str], edge_version: str | None,
                  min_graded: int = MIN_GRADED) -> tuple[Outcomes, str]:
    """The records of `edge_version` (None: the version with the most records) from `source` (a Redis URL or a
    JSON-lines file, or several); and that version. Graded labels (`GRADED_SOURCES`: the edge's answer judged
    against the cloud's, graded traffic) alone once the version has `min_graded` of them: the cascade's verdicts
    then only add noise, since they disagree with graded ones exactly where the cascade kept a fluent wrong answer
    (and an escalated request has both). Before that, every record."""
    records = _records([source] if isinstance(source, str) else source)
    rows: dict[str, list[tuple[RouterFeatures, int]]] = {}
    graded: dict[str, list[tuple[RouterFeatures, int]]] = {}
    verified: dict[str, list[tuple[RouterFeatures, int]]] = {}  # graded kept answers (`router.verify`)
    kept: collections.Counter[str] = collections.Counter()  # the cascade's kept answers, per version
    skipped = 0
    for rec in records:
        try:
            if not isinstance(rec, dict) or rec.get("fv") != FEATURES_VERSION or rec.get("label") not in (0, 1):
                raise ValueError("not a usable record")
            if rec.get("reason") in _NOT_ABOUT_THE_PROMPT:
                raise ValueError("the edge was down, not wrong")
            version, row = str(rec["edge_version"]), (RouterFeatures.from_json(rec["features"]), int(rec["label"]))
            if rec.get("source") not in GRADED_SOURCES:
                rows.setdefault(version, []).append(row)
                kept[version] += rec.get("source") == "cascade" and row[1] == 1
            else:
                (verified if rec.get("reason") == "verify" else graded).setdefault(version, []).append(row)
        except (KeyError, ValueError, TypeError):
            skipped += 1
    versions = {v: len(rows.get(v, ())) + len(graded.get(v, ())) + len(verified.get(v, ()))
                for v in {*rows, *graded, *verified}}
    if edge_version is None:
        edge_version = max(sorted(versions), key=lambda v: versions[v], default="")
    own_verified = verified.get(edge_version, [])
    own_graded = graded.get(edge_version, []) + own_verified
    use_graded = len(own_graded) >= max(min_graded, 1)
    if use_graded:
        # Escalations are all graded, kept answers only a sample: each verified one stands for the kept answers not
        # verified (the cascade's count of them over the verified), or graded labels would over-represent what
        # the edge was unsure of (bench/cascade/learned measures both).
        weight = min(_MAX_WEIGHT, max(1, round(kept[edge_version] / len(own_verified)))) if own_verified else 1
        chosen = graded.get(edge_version, []) + own_verified * weight
    else:
        chosen = rows.get(edge_version, []) + own_graded
    x = np.array([f.vector() for f, _ in chosen]) if chosen else np.zeros((0, DENSE + HASH_BUCKETS))
    y = np.array([label for _, label in chosen], dtype=np.float64)
    return Outcomes(x, y, skipped, versions, "graded" if use_graded else "all", len(own_graded)), edge_version


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * (1.0 + np.tanh(0.5 * z)))


def _newton(x: np.ndarray, y: np.ndarray, mean: Vector, penalty: Vector, iters: int = 30) -> Vector:
    """Minimise the logistic loss + 0.5 * sum(penalty * (theta - mean)^2); x carries a last column of ones."""
    theta = mean.copy()
    for _ in range(iters):
        p = _sigmoid(x @ theta)
        grad = x.T @ (p - y) + penalty * (theta - mean)
        s = p * (1 - p)
        hess = (x * s[:, None]).T @ x + np.diag(penalty + 1e-9)
        step = np.linalg.solve(hess, grad)
        theta = theta - step
        if float(np.max(np.abs(step))) < 1e-7:
            break
    return np.asarray(theta)


def _fit_linear(x: np.ndarray, y: np.ndarray, prior: RouterModel | None, l2: float,
                prior_strength: float) -> Vector:
    xb = np.hstack([x, np.ones((len(x), 1))])
    mean = np.zeros(xb.shape[1])
    penalty = np.full(xb.shape[1], l2)
    penalty[-1] = 1e-4  # the intercept is the base rate: barely pulled
    if prior is not None:
        mean[:-1], mean[-1] = prior.weights, prior.bias
        penalty[:] = prior_strength
        penalty[-1] = prior_strength * 1e-2
    return _newton(xb, y, mean, penalty)


def _folds(x: np.ndarray) -> np.ndarray:
    """Each record's fold: records are in time order, so dealing them out makes every fold span the whole period;
    the records of one prompt (the same features: a repeated question) all go to the fold of its first one, or
    held-out scores would reward remembering prompts over generalising from them."""
    first: dict[bytes, int] = {}
    out = np.empty(len(x), int)
    for i, row in enumerate(x):
        out[i] = first.setdefault(row.tobytes(), len(first)) % _FOLDS
    return out


def _auc(score: np.ndarray, y: np.ndarray) -> float | None:
    pos, neg = score[y == 1], score[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return None
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    ranks = np.empty(len(order))
    ranks[order] = np.arange(1, len(order) + 1)
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def fit_router(data: Outcomes, edge_version: str, *, prior: RouterModel | None = None, l2: float | None = None,
               prior_strength: float = 20.0) -> RouterModel:
    """A calibrated router for `edge_version` from its outcomes (ValueError when they cannot make one).

    `l2` None: the regularisation is chosen from `L2_GRID` by held-out log loss on the training folds (a fixed
    one over-fits the hashed words of repeated prompts on some traffic and under-fits on other)."""
    with one_blas_thread():  # the same file from the same records on any machine; no threads thrashing 2 cores
        return _fit_router(data, edge_version, prior, l2, prior_strength)


def _log_loss(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def _held_out(x: np.ndarray, y: np.ndarray, prior: RouterModel | None, l2: float,
              prior_strength: float) -> tuple[np.ndarray, Vector, float]:
    """Out-of-fold logits, the Platt calibration fitted on them, and its held-out log loss."""
    folds = _folds(x)
    held = np.zeros(len(y))
    for k in range(_FOLDS):
        train, test = folds != k, folds == k
        if y[train].min() == y[train].max():
            held[test] = 0.0
            continue
        theta = _fit_linear(x[train], y[train], prior, l2, prior_strength)
        held[test] = x[test] @ theta[:-1] + theta[-1]
    platt = _newton(np.column_stack([held, np.ones(len(y))]), y, np.array([1.0, 0.0]), np.array([1e-3, 1e-3]))
    return held, platt, _log_loss(_sigmoid(platt[0] * held + platt[1]), y)


def cutoff_table(p: np.ndarray, y: np.ndarray) -> list[dict[str, float]]:
    """For each candidate `edge_success.max`, on held-out predictions: the share of requests it sends straight to
    the cloud, and the share of the answers that stood among everything it sends there (what it costs)."""
    out = []
    stood = max(float(y.sum()), 1.0)
    for cut in CUTOFFS:
        routed = p <= cut
        out.append({"max": cut, "routed": round(float(routed.mean()), 4),
                    "stood_routed": round(float(y[routed].sum()) / stood, 4)})
    return out


def _fit_router(data: Outcomes, edge_version: str, prior: RouterModel | None, l2: float | None,
                prior_strength: float) -> RouterModel:
    x, y = data.x, data.y
    if len(y) < 2 * _FOLDS or y.min() == y.max():
        raise ValueError(f"{len(y)} outcomes for {edge_version!r}; training needs at least {2 * _FOLDS} with both "
                         "labels (answers that stood and answers that did not)")
    # with a prior, every weight is pulled towards it by prior_strength, and l2 plays no part
    grid = (l2,) if l2 is not None else (L2_GRID[0],) if prior is not None else L2_GRID
    tried = {g: _held_out(x, y, prior, g, prior_strength) for g in grid}
    chosen = min(grid, key=lambda g: tried[g][2])
    held, platt, _ = tried[chosen]
    theta = _fit_linear(x, y, prior, chosen, prior_strength)
    p = np.clip(_sigmoid(platt[0] * held + platt[1]), 1e-6, 1 - 1e-6)
    meta = {"outcomes": len(y), "stood_share": round(float(y.mean()), 4), "trained_at": time.time(),
            "prior_version": prior.edge_version if prior is not None else None,
            "l2": chosen, "l2_held_out_log_loss": {str(g): round(v[2], 4) for g, v in tried.items()},
            "held_out": {"log_loss": round(_log_loss(p, y), 4),
                         "brier": round(float(np.mean((p - y) ** 2)), 4),
                         "auc": None if (a := _auc(held, y)) is None else round(a, 4)},
            "cutoffs": cutoff_table(p, y)}
    for name, v in (("weights", theta), ("platt", platt)):
        if not np.all(np.isfinite(v)):
            raise ValueError(f"the fit diverged ({name} not finite)")
    a, c = float(platt[0]), float(platt[1])
    if not math.isfinite(a) or a <= 0:  # held-out scores that rank backwards cannot calibrate anything yet:
        # keep the prior's calibration, or, without one, predict the base rate
        a, c = (prior.platt_a, prior.platt_b) if prior is not None else (1e-6, float(np.log(y.mean() / (1 - y.mean()))))
        meta["calibration"] = "prior" if prior is not None else "base_rate"
    return RouterModel(edge_version, theta[:-1], float(theta[-1]), a, c, meta)
