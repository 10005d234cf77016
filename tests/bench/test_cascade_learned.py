"""bench/cascade/learned on the committed bench/cascade answers: the replay scores each design
on the evaluation half only; what a design did is counted the way the table says."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cascade.learned import _outcome, run
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


@pytest.mark.skipif(not MMLU_FILE.exists(), reason="needs ../shared/data (the MMLU questions the answers are of)")
def test_the_replay_of_the_committed_answers():
    out = run(RESULTS / "cascade.json")
    assert out["n_calibration"] == out["n_evaluation"] == 419
    designs = out["designs"]
    cascade, routed = designs["cascade only @ 5%"], designs["router then cascade (graded labels) @ 5%"]
    assert cascade["straight_to_cloud"] == 0 and cascade["wasted_edge_attempts"] > 0.5
    assert routed["wasted_edge_attempts"] < cascade["wasted_edge_attempts"] / 2
    assert routed["mmlu_straight_to_cloud"] >= 0.9
    assert out["router_inference_ms"]["median_cpu_ms_per_request"] > 0  # measured (its bound is the bench's)
