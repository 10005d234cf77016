"""Choosing the model's design with the training sources only: leave-one-source-out inside the training data.

For every design in GRID and every training source S: fit on the other training sources, compute the APGR on
S; the design with the best mean over S wins (the first in GRID order on a tie). A design that ranks a kind of
traffic it never saw well is what a gateway in front of new traffic needs, so that is the criterion. The
multiple-choice expert is left out here: it does not depend on the design, and it scores only prompts with
answer options. `Design.invariance` is not chosen here: it is a requirement of the product (a threshold should
cut every kind of traffic at about the same share), not a way to rank better, and its cost is measured.

bench/router runs this inside each of its outer folds (nested), so the numbers it reports for a held-out
source never helped choose anything.

Tested in `tests/complexity/test_train.py`.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from tiergate.complexity.apgr import apgr
from tiergate.complexity.features import CONTENT
from tiergate.complexity.model import Design
from tiergate.complexity.train import fit, ridge, source_weights, target

__all__ = ["GRID", "MIN_SOURCES", "select_design"]

MIN_SOURCES = 3  # with fewer, an inner fold would train on a single source
GRID: tuple[Design, ...] = tuple(
    Design(alpha=alpha, center=center, trust_quantile=q)
    for alpha, center, q in itertools.product((10.0, 100.0, 1000.0), (False, True), (0.9, 0.95)))


def select_design(h: np.ndarray, weak: np.ndarray, strong: np.ndarray, src: np.ndarray,
                  rows: np.ndarray | None = None, grid: tuple[Design, ...] = GRID) -> tuple[Design, dict[str, Any]]:
    """The design with the best mean leave-one-source-out APGR among the sources of `rows` (default: all)."""
    rows = np.ones(len(h), bool) if rows is None else rows
    names = sorted(set(src[rows].tolist()))
    if len(names) < MIN_SOURCES:
        raise ValueError(f"choosing a design needs at least {MIN_SOURCES} sources, got {len(names)}")
    table = np.zeros((len(grid), len(names)))
    x = h[:, np.array(CONTENT)]
    for j, held in enumerate(names):
        tr, te = rows & (src != held), rows & (src == held)
        sw = source_weights(src[tr])
        heads = {(d.alpha, d.center, d.invariance): ridge(x[tr], target(weak[tr], strong[tr], src[tr], d.center), sw,
                                                          d.alpha, src[tr], d.invariance) for d in grid}
        for i, design in enumerate(grid):
            head = heads[design.alpha, design.center, design.invariance]
            m = fit(h[tr], weak[tr], strong[tr], src[tr], design, head=head)
            table[i, j] = apgr(m.raw_batch(h[te]), weak[te], strong[te])
    best = int(np.argmax(table.mean(1)))
    return grid[best], {"criterion": "mean leave-one-source-out APGR over the training sources",
                        "designs_tried": len(grid),
                        "inner_apgr": {k: round(float(v), 4) for k, v in zip(names, table[best], strict=True)},
                        "inner_mean": round(float(table[best].mean()), 4)}
