"""bench/cache/errbound: the stream built from pairs, the fixed-threshold baselines, and the table's verdicts."""

from __future__ import annotations

import asyncio

import numpy as np

from bench.cache.calibrate import labelled
from bench.cache.errbound import (
    Stream,
    best_fixed_recall,
    fixed_for,
    render,
    render_splits,
    replay,
    star_hubs,
    streams,
)
from bench.cache.pairs import Pairs


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


def _split(seed: int, fhr: float | None, fhr_max: float | None, recall: float, hindsight: float,
           fixed_fhr: float | None, fixed_recall: float) -> dict:
    return {"seed": seed, "fhr": fhr, "fhr_max": fhr_max, "recall": recall, "hindsight_recall": hindsight,
            "fixed_fhr": fixed_fhr, "fixed_recall": fixed_recall}


def test_the_splits_table_compares_each_split_with_its_own_hindsight_threshold() -> None:
    sp = {"splits": 2, "orders": 3, "rows": [
        {"bound": 0.10, "per_split": [_split(1000, 0.08, 0.09, 0.12, 0.10, 0.105, 0.19),
                                      _split(1001, 0.09, 0.101, 0.10, 0.125, 0.095, 0.17)]},
        {"bound": 0.05, "per_split": [_split(1000, None, None, 0.0, 0.0, None, 0.0),
                                      _split(1001, None, None, 0.0, 0.0, None, 0.0)]}]}
    text = "\n".join(render_splits(sp))
    # ratios 1.2 and 0.8: mean 1.0, one split higher; one split's worst order went over; the fixed one over in one
    assert ("| 10% | 0.085 (0.080-0.090), an order **over** in 1 of 2 splits | 0.110 | 0.113 | 1.000 (0.800-1.200), "
            "1 of 2 | 0.100 (0.095-0.105), **over** in 1 of 2 | 0.180 |") in text
    assert "| 5% | - (nothing served) | 0 | - | - | - (none reaches it) | 0.000 |" in text
    assert "verifier" not in text  # results without the verifier's splits: no second table


def test_the_verifiers_splits_get_their_own_table_beside_the_cosines_hindsight_threshold() -> None:
    one = _split(1000, 0.08, 0.09, 0.12, 0.10, 0.105, 0.19) | {
        "verifier": {"fhr": 0.085, "fhr_max": 0.09, "recall": 0.15, "hindsight_recall": 0.10}}
    two = _split(1001, 0.09, 0.101, 0.10, 0.125, 0.095, 0.17)  # a split without the verifier (beyond the first)
    sp = {"splits": 2, "orders": 3, "verifier_splits": 1, "rows": [{"bound": 0.10, "per_split": [one, two]}]}
    text = "\n".join(render_splits(sp))
    assert "The cross-encoder verifier on the first 1 of those splits" in text
    assert "| 10% | 0.085 (0.085-0.085) | 0.150 | 0.100 | 1.500 (1.500-1.500), 1 of 1 |" in text


def test_other_splits_are_other_halves_of_the_same_pairs() -> None:
    rng = np.random.default_rng(0)
    n = 400
    va = rng.normal(size=(n, 8)).astype(np.float32)
    va /= np.linalg.norm(va, axis=1, keepdims=True)
    pairs = Pairs([f"question number {i}" for i in range(n)], [f"another question {i}" for i in range(n)],
                  rng.random(n) < 0.5, va, va)
    data = labelled(pairs)
    fixed = streams(data)
    one, other = streams(data, seed=1000), streams(data, seed=1001)
    for _cal, _sco, stats in (fixed, one, other):
        assert stats["calibration"]["lookups"] + stats["scoring"]["lookups"] == n
    assert sorted(one[1].query.tolist()) != sorted(other[1].query.tolist())
    assert sorted(fixed[1].query.tolist()) == sorted(streams(data)[1].query.tolist())


def test_the_replay_counts_shadow_checked_hits_as_served_and_tier_checked_ones_as_not() -> None:
    n = 2000
    s = _stream([0.99] * n, [True] * n)  # every lookup right, at one cosine, certified by the warm stream
    warm = _stream([0.99] * n, [True] * n)
    tier = asyncio.run(replay(s, 0.10, seed=1, warm=warm, mode="tier"))
    shadow = asyncio.run(replay(s, 0.10, seed=1, warm=warm, mode="shadow"))
    assert 0 < tier["verified_share"] == shadow["verified_share"] < 0.1  # the same sample checked (3 %)
    assert tier["served"] == round(n * (1 - tier["verified_share"]))  # sent to the tier instead
    assert shadow["served"] == n and shadow["recall"] == 1.0 and shadow["fhr"] == 0.0
