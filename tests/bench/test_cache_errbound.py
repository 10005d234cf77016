"""bench/cache/errbound: the stream built from pairs, the fixed-threshold baselines, and the table's verdicts."""

from __future__ import annotations

import numpy as np

from bench.cache.errbound import Stream, best_fixed_recall, fixed_for, render, star_hubs


def test_star_hubs_make_the_busiest_question_the_entry() -> None:
    # question 0 is in three pairs, 3 in one more with 4: 0 is the hub of its three, and 3 or 4 of theirs
    a, b = np.array([0, 0, 0, 3]), np.array([1, 2, 3, 4])
    hubs = star_hubs(a, b)
    assert hubs[:3].tolist() == [0, 0, 0] and hubs[3] in (3, 4)
    assert star_hubs(a, b).tolist() == hubs.tolist()  # deterministic


def _stream(sims: list[float], dup: list[bool], vetoed: list[bool] | None = None) -> Stream:
    n = len(sims)
    return Stream(np.zeros(n, int), np.arange(n), np.array(sims), np.ones(n), np.array(dup),
                  np.array(vetoed if vetoed is not None else [False] * n))


def test_fixed_thresholds_are_judged_on_served_hits_and_skip_vetoed_ones() -> None:
    # 100 right at 0.99, 20 wrong at 0.95, 80 right at 0.90; one wrong at 0.995 that the guards veto
    s = _stream([0.99] * 100 + [0.95] * 20 + [0.90] * 80 + [0.995], [True] * 100 + [False] * 20 + [True] * 80 + [False],
                [False] * 200 + [True])
    assert fixed_for(s, 0.10) == 0.8  # the grid's lowest: 20 wrong of 200 served is exactly 10 %
    assert fixed_for(s, 0.05) == 0.9525  # only the tail above the wrong ones
    recall, t = best_fixed_recall(s, 0.10)
    assert (recall, t) == (1.0, 0.8)
    assert best_fixed_recall(s, 0.05) == (round(100 / 180, 4), 0.9525)
    assert fixed_for(s, 0.01, min_hits=101) is None  # the clean tail is too small
    assert best_fixed_recall(s, None) == (0.0, None)


def _row(fhrs: list[float], bound: float) -> dict:
    res = {"served": 100.0, "fhr": float(np.mean(fhrs)), "fhr_min_max": [min(fhrs), max(fhrs)], "recall": 0.2,
           "verified_share": 0.01, "judged_share": 0.05, "orders": len(fhrs), "best_fixed_recall_at_same_fhr": 0.19,
           "best_fixed_threshold": 0.95, "orders_over": sum(f > bound for f in fhrs)}
    return {"bound": bound, "fixed_calibrated": {"threshold": None, "served": 0, "fhr": None, "recall": 0.0},
            "bounded_calibrated": res}


def test_the_table_says_how_many_orders_went_over_the_bound() -> None:
    eb = {"streams": {"scoring": {"lookups": 10, "entries": 5, "duplicates": 4, "vetoed_share": 0.5},
                      "calibration": {"lookups": 10}},
          "orders": 3, "verify_rate": 0.03, "rows": [_row([0.09, 0.095, 0.102], 0.10), _row([0.1, 0.12, 0.14], 0.15)]}
    text = "\n".join(render(eb, "cmd", "today"))
    assert "| 10% | bounded, calibrated | 100 | 0.096 (0.090-0.102) **over** in 1 of 3 | 0.200 |" in text
    assert "| 15% | bounded, calibrated | 100 | 0.120 (0.100-0.140) | 0.200 |" in text
    assert "Ceiling" not in text  # no ceiling in these results: no table
