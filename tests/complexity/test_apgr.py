"""APGR as ../shared/data/README.md defines it: its fixed points, ties, fractional labels and the bootstrap path."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.complexity.apgr import apgr, apgr_resampled, pgr_curve, share_for_pgr

rng = np.random.default_rng(0)
WEAK = (rng.random(400) < 0.6).astype(float)
STRONG = np.maximum(WEAK, (rng.random(400) < 0.5).astype(float))


def test_an_oracle_beats_random_and_a_constant_scores_one_half():
    oracle = STRONG - WEAK
    assert apgr(oracle, WEAK, STRONG) > 0.85
    assert apgr(np.zeros(400), WEAK, STRONG) == pytest.approx(0.5)  # one tie: escalated all together
    assert apgr(-oracle, WEAK, STRONG) < 0.5 < np.mean([apgr(rng.random(400), WEAK, STRONG) for _ in range(50)]) + 0.05


def test_the_curve_runs_from_weak_only_to_strong_only():
    x, y = pgr_curve(rng.random(400), WEAK, STRONG)
    assert x[0] == 0 and x[-1] == 1 and y[0] == pytest.approx(0) and y[-1] == pytest.approx(1)


def test_fractional_labels_are_qualities():
    weak, strong = np.array([0.9, 0.2, 0.5, 0.5]), np.array([0.9, 0.9, 0.6, 0.5])
    assert apgr(np.array([0.0, 1.0, 0.5, 0.1]), weak, strong) > apgr(np.array([1.0, 0.0, 0.1, 0.5]), weak, strong)


def test_the_bootstrap_path_equals_the_plain_one_on_the_original_sample():
    scores = np.round(rng.random(400), 1)  # with ties
    once = apgr_resampled(scores, WEAK, STRONG, np.ones((1, 400), int))
    assert once[0] == pytest.approx(apgr(scores, WEAK, STRONG), abs=1e-12)
    twice = apgr_resampled(scores, WEAK, STRONG, np.full((1, 400), 2))  # every prompt twice: the same curve
    assert twice[0] == pytest.approx(once[0], abs=1e-12)


def test_share_needed_for_a_pgr_grows_with_the_target():
    scores = STRONG - WEAK + 0.3 * rng.random(400)
    assert 0 < share_for_pgr(scores, WEAK, STRONG, 0.5) < share_for_pgr(scores, WEAK, STRONG, 0.8) <= 1
