"""bench/cache/ceiling: the hindsight cut of a ranking, and its table from the results."""

from __future__ import annotations

import numpy as np

from bench.cache import ceiling
from bench.cache.ceiling import RANKINGS, frontier, render
from bench.cache.cross_encoder import ceiling as ce_ceiling


def test_frontier_takes_the_longest_prefix_within_the_bound() -> None:
    # 60 right, then 10 wrong, then 40 right, then 100 wrong: within 10 % the cut is after the 40 right ones
    wrong = np.array([False] * 60 + [True] * 10 + [False] * 40 + [True] * 100)
    score = -np.arange(len(wrong), dtype=float)  # already in order
    got = frontier(score, wrong, duplicates=200, bound=0.10)
    assert got == {"recall": 0.5, "fhr": 0.0909, "served": 110}
    assert frontier(score, wrong, duplicates=200, bound=0.0)["served"] == 60
    # the order comes from the score, not the input order
    flipped = frontier(score[::-1].copy(), wrong, duplicates=200, bound=0.10)
    assert flipped["recall"] == 0.0 and flipped["fhr"] is None


def test_frontier_needs_enough_hits() -> None:
    wrong = np.array([False] * (ceiling.MIN_HITS - 1) + [True] * 10)
    assert frontier(-np.arange(len(wrong), dtype=float), wrong, 100, 0.0)["served"] == 0  # 49 right are too few
    assert frontier(-np.arange(len(wrong), dtype=float), wrong, 100, 0.02)["served"] == ceiling.MIN_HITS


def test_render_names_every_ranking_and_its_numbers() -> None:
    row = {"bound": 0.1} | {r: {"recall": 0.1 + i / 100, "fhr": 0.099, "served": 10} for i, r in enumerate(RANKINGS)}
    empty = {"bound": 0.02} | {r: {"recall": 0.0, "fhr": None, "served": 0} for r in RANKINGS}
    text = "\n".join(render({"fitted_on": 5678, "scored": 5767, "duplicates": 7446, "rows": [empty, row]}))
    assert "| 10% | 0.100 (0.099) | 0.110 (0.099) | 0.120 (0.099) |" in text
    assert "| 2% | 0.000 (-) | 0.000 (-) | 0.000 (-) |" in text
    assert "5,767 guard-passed lookups" in text and "5,678" in text


def test_the_cross_encoder_experiment_ranks_only_what_the_error_bound_would_see() -> None:
    """bench/cache/cross_encoder's ceiling: guard-vetoed and below-floor lookups are left out; a score that knows
    the labels reaches every right hit at any bound, the cosine does not."""
    rng = np.random.default_rng(3)
    n = 2000
    duplicate = rng.random(n) < 0.5
    cosine = np.clip(0.9 + 0.05 * rng.standard_normal(n), 0.0, 1.0)  # says nothing about the label
    vetoed = rng.random(n) < 0.2
    perfect = duplicate.astype(float) + 0.01 * rng.random(n)
    tune, held = np.arange(0, n, 2), np.arange(1, n, 2)
    got = ce_ceiling(cosine, duplicate, vetoed, tune, held, perfect[tune], perfect[held])
    seen = ~vetoed[held] & (cosine[held] >= 0.8)
    assert got["scored"] == int(seen.sum()) and got["duplicates"] == int(duplicate[held].sum())
    row = next(r for r in got["rows"] if r["bound"] == 0.02)
    assert row["cross-encoder"]["fhr"] == 0.0
    assert row["cross-encoder"]["recall"] == round(int((duplicate[held] & seen).sum()) / got["duplicates"], 4)
    assert row["cosine and cross-encoder"]["recall"] == row["cross-encoder"]["recall"]
    assert row["cosine"]["recall"] < 0.2  # a label-blind ranking cannot stay within 2 %
