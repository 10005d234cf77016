"""How much recall could any ranking of cache candidates reach at each false-hit bound, even in hindsight?

    .venv/bin/python -m bench.cache --only errbound    (this runs with the error-bound table)

The error bound serves cells of (cosine, word overlap); a fixed threshold serves a cosine tail. Either can only
beat the other by ranking candidates better. This measures the ceiling of three rankings on the scoring half of
the labelled pairs (`pairs.split`, guards on, cosine >= the error bound's floor), each cut in hindsight at the
best point of the scored half itself (the largest prefix whose false-hit rate is within the bound, at least 50
hits): no confidence margin, no learning cost, so an upper limit for any method that ranks by the same signal:

- cosine: what every fixed threshold ranks by;
- cosine per word-overlap region: a logistic fit, intercept and cosine slope per region of
  `cache.errbound.OVERLAP_EDGES` (the signal the error bound's regions add), fitted on the calibration half;
- cosine + surface features: gradient-boosted trees (scikit-learn) on the cosine, the overlap, each side's
  content-word count, each side's content words missing on the other, the relative length difference and whether
  both start with the same word: every cheap signal a lookup has, fitted on the calibration half.

Definitions as in bench/cache/errbound.py: false-hit rate = wrong served / served; recall = right served /
duplicate-labelled lookups of the scored half.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.linear_model import LogisticRegression

from bench.cache.calibrate import Labelled
from bench.cache.pairs import split
from tiergate.cache.errbound import FLOOR, OVERLAP_EDGES

MIN_HITS = 50
RANKINGS = ("cosine", "cosine per overlap region", "cosine + surface features")


def features(data: Labelled) -> np.ndarray:
    """(n, 8): cosine, overlap, content words a / b, a's missing in b, b's missing in a, length gap, same start."""
    rows = []
    for a, b in zip(data.pairs.a, data.pairs.b, strict=True):
        ca, cb = set(data.sigs[a].content), set(data.sigs[b].content)
        rows.append([len(ca), len(cb), len(ca - cb), len(cb - ca), abs(len(a) - len(b)) / max(len(a), len(b), 1),
                     float(a.lower().split()[:1] == b.lower().split()[:1])])
    return np.column_stack([data.pairs.cosine.astype(float), data.overlap, np.array(rows, float)])


def _region_design(x: np.ndarray) -> np.ndarray:
    """One intercept and one cosine slope per overlap region."""
    g = np.searchsorted(OVERLAP_EDGES, x[:, 1], side="right")
    onehot = (g[:, None] == np.arange(len(OVERLAP_EDGES) + 1)[None, :]).astype(float)
    return np.hstack([onehot, onehot * ((x[:, :1] - 0.95) * 20)])


def frontier(score: np.ndarray, wrong: np.ndarray, duplicates: int, bound: float) -> dict[str, Any]:
    """The best prefix of `score` (descending) whose false-hit rate is within `bound`: recall and its rate."""
    order = np.argsort(-score, kind="stable")
    bad = np.cumsum(wrong[order])
    n = np.arange(1, len(order) + 1)
    ok = np.flatnonzero((bad <= bound * n) & (n >= MIN_HITS))
    if not len(ok):
        return {"recall": 0.0, "fhr": None, "served": 0}
    k = ok[np.argmax((n - bad)[ok])]
    return {"recall": round(float(n[k] - bad[k]) / duplicates, 4), "fhr": round(float(bad[k] / n[k]), 4),
            "served": int(n[k])}


def run(bounds: tuple[float, ...], data: Labelled) -> dict[str, Any]:
    pairs, vetoed = data.pairs, data.vetoed
    x = features(data)
    wrong = ~pairs.duplicate.astype(bool)
    cal, sco = split(len(wrong))
    fit = cal[~vetoed[cal] & (x[cal, 0] >= FLOOR)]
    scored = sco[~vetoed[sco] & (x[sco, 0] >= FLOOR)]
    region = LogisticRegression(C=1.0, max_iter=5000).fit(_region_design(x[fit]), wrong[fit])
    trees = HistGradientBoostingClassifier(max_iter=200, learning_rate=0.05, max_leaf_nodes=15,
                                           random_state=0).fit(x[fit], wrong[fit])
    scores = {"cosine": x[scored, 0],
              "cosine per overlap region": -region.predict_proba(_region_design(x[scored]))[:, 1],
              "cosine + surface features": -trees.predict_proba(x[scored])[:, 1]}
    duplicates = int((~wrong[sco]).sum())
    return {"fitted_on": len(fit), "scored": len(scored), "duplicates": duplicates,
            "rows": [{"bound": d} | {name: frontier(s, wrong[scored], duplicates, d) for name, s in scores.items()}
                     for d in bounds]}


def render(ceiling: dict[str, Any]) -> list[str]:
    return ["", ("Ceiling of the rankings (`bench/cache/ceiling.py`, same run and raw results, `errbound.ceiling`): "
                  f"recall on the scoring half at the best hindsight cut of each ranking ({ceiling['scored']:,} "
                  f"guard-passed lookups at cosine >= {FLOOR:g}; the learnt rankings fitted on the calibration half's "
                  f"{ceiling['fitted_on']:,}). This cut pays no confidence margin and learns nothing online: a method "
                  "that ranks by one of these signals can only beat its column by chance."), "",
             *table(ceiling["rows"], RANKINGS, "{}: recall (false-hit rate)")]


def table(rows: list[dict[str, Any]], rankings: tuple[str, ...], heading: str = "{}") -> list[str]:
    """One line per bound: each ranking's recall (and false-hit rate) at its hindsight cut."""
    lines = ["| bound | " + " | ".join(heading.format(r) for r in rankings) + " |", "|---|" + "---|" * len(rankings)]
    for row in rows:
        cells = [f"{row[r]['recall']:.3f} ({'-' if row[r]['fhr'] is None else format(row[r]['fhr'], '.3f')})"
                 for r in rankings]
        lines.append(f"| {row['bound']:.0%} | " + " | ".join(cells) + " |")
    return lines
