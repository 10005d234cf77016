"""bench/cascade/learned on the committed bench/cascade answers: cross-validated, each request scored once by a
router and parameters chosen without it; what a design did is counted the way the table says."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cascade.learned import _cross_fitted, _outcome, choose_cut, label_sets, run, task_folds
from bench.cascade.tasks import MMLU_FILE
from bench.report import RESULTS


def test_the_outcome_of_a_design_counts_escalations_and_straight_sends_apart():
    d = {"right": np.array([1.0, 0.0, 0.0, 1.0]), "done_s": np.array([1.0, 2.0, 3.0, 4.0]),
         "cpu_s": np.array([0.1, 0.2, 0.3, 0.4]), "tasks": ["a", "mmlu", "mmlu", "a"]}
    idx = np.arange(4)
    keep = np.array([True, False, False, True])
    attempted = np.array([True, True, False, True])  # request 2 went straight to the cloud
    out = _outcome(keep, attempted, d, idx)
    assert out["kept"] == 0.5 and out["loss"] == 0.0
    assert out["wasted_edge_attempts"] == 0.25 and out["straight_to_cloud"] == 0.25
    assert out["added_latency_cloud_p50_s"] == 1.0  # the escalated one waited 2 s, the one sent straight 0 s
    assert out["edge_cpu_s_per_request"] == pytest.approx((0.1 + 0.2 + 0.4) / 4, abs=1e-4)
    assert out["mmlu_straight_to_cloud"] == 0.5


def test_the_label_sources_and_what_they_leave_unlabelled():
    right = np.array([1.0, 0.0, 1.0, 0.0])
    conf = np.array([-0.1, -0.2, -2.0, -3.0])  # the first two kept at the threshold -1, the others escalated
    agree = np.array([1.0, 1.0, np.nan, 0.0])  # the judge: the second is a kept wrong answer it did not catch
    sets = label_sets(right, conf, agree, -1.0)
    assert sets["cascade labels"].tolist() == [1, 1, 0, 0] and sets["graded labels"] is right
    assert np.array_equal(sets["agreement labels"], agree, equal_nan=True)
    assert np.array_equal(sets["agreement labels, escalations only"], [np.nan, np.nan, np.nan, 0.0], equal_nan=True)


def test_unlabelled_requests_are_predicted_for_but_never_trained_on():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    y = (x[:, 0] > 0).astype(float)
    noisy = y.copy()
    noisy[::3] = np.nan
    p = _cross_fitted(x, noisy)
    assert not np.isnan(p).any() and ((p > 0.5) == (y == 1)).mean() > 0.8


def test_every_fold_holds_every_task_and_the_same_seed_deals_the_same():
    tasks = ["a"] * 10 + ["b"] * 7
    folds = task_folds(tasks, 0)
    assert all({tasks[i] for i in np.nonzero(folds == k)[0]} == {"a", "b"} for k in range(5))
    assert (folds == task_folds(tasks, 0)).all() and not (folds == task_folds(tasks, 1)).all()


def test_of_cutoffs_that_keep_as_much_the_lowest_is_chosen():
    # requests 0 and 1 are confident failures; once both go straight to the cloud the other two are kept, and
    # every cut from 0.1 up to the first right answer's P (0.6) keeps as much: the lowest, 0.1, is the one taken
    conf = np.array([-0.1, -0.2, -0.3, -0.4])
    right = np.array([0.0, 0.0, 1.0, 1.0])
    p = np.array([0.05, 0.1, 0.6, 0.9])
    cut, threshold = choose_cut(conf, right, p, 0.0)
    assert cut == 0.1 and threshold == -0.4


@pytest.mark.skipif(not MMLU_FILE.exists(), reason="needs ../shared/data (the MMLU questions the answers are of)")
def test_the_replay_of_the_committed_answers():
    out = run(RESULTS / "cascade.json", mmlu_study=False, l2=1.0)  # l2 fixed: the trainer's grid is 4x slower
    assert out["requests"] == 838 and out["folds"] == 5
    designs = out["designs"]
    cascade, routed = designs["cascade only @ 5%"], designs["router then cascade (graded labels) @ 5%"]
    assert len(routed["per_fold"]) == 5 and all(0 <= f["cutoff"] <= 0.6 for f in routed["per_fold"])
    assert cascade["straight_to_cloud"] == 0 and cascade["wasted_edge_attempts"] > 0.5
    assert routed["loss"] <= cascade["loss"] + 0.005 and routed["kept"] >= cascade["kept"]
    assert routed["wasted_edge_attempts"] < cascade["wasted_edge_attempts"] / 2
    assert routed["added_latency_cloud_p50_s"] <= cascade["added_latency_cloud_p50_s"] / 2
    assert routed["mmlu_straight_to_cloud"] >= 0.9
    against = routed["against_cascade_only"]
    assert against["kept_by_cascade_only_not_here"] == sum(against["lost_by_task"].values())
    assert out["router_inference_ms"]["median_cpu_ms_per_request"] > 0  # measured (its bound is the bench's)
    # The product's judge (edge answer against the gold one) labels nearly as the exact checker does, and trained
    # on it for every request the router cuts wasted attempts as graded labels do; on escalations alone it
    # cannot tell MMLU apart (the kept fluent guesses are never graded).
    assert out["judge_against_checker"]["all"]["same_as_checker"] > 0.9
    agreement = designs["router then cascade (agreement labels) @ 5%"]
    escalations = designs["router then cascade (agreement labels, escalations only) @ 5%"]
    assert agreement["wasted_edge_attempts"] < cascade["wasted_edge_attempts"] / 2
    assert escalations["mmlu_straight_to_cloud"] < agreement["mmlu_straight_to_cloud"]
