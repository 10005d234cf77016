"""bench/cascade's checkers and metrics on inputs small enough to verify by hand (no model, no server)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.cascade.analysis import analyse, split
from bench.cascade.check import EntityIndex, entity_right, letter_right, normalise, number_right, numbers
from bench.cascade.combine import choose
from bench.cascade.metrics import apgr, at_threshold, auroc, bootstrap_ci, kept_at_loss
from bench.cascade.report import markdown
from bench.cascade.runner import Answer
from bench.cascade.signals import answer_signals
from bench.cascade.tasks import make_items
from tiergate.policies.confidence import TokenScore

# ------------------------------------------------------------------------------------------- checkers


def test_normalise_drops_case_accents_and_punctuation() -> None:
    assert normalise("  Bogotá, D.C.!") == "bogota dc"
    assert normalise("Sana'a") == "sanaa"
    assert normalise("Port-au-Prince") == "port au prince"


@pytest.mark.parametrize(("answer", "gold", "operands", "right"), [
    ("15", 15, (7, 8), True),
    ("7 + 8 = 15", 15, (7, 8), True),           # restating the question is not an answer
    ("The answer is 1 + 7 = 8.", 8, (1, 7), True),
    ("1 * 7 = 7", 7, (1, 7), True),             # the gold may equal an operand: one occurrence is removed
    ("The answer is: 4", 10, (4, 6), False),    # only an operand: no result given
    ("The answer is 11.", 15, (7, 8), False),
    ("8 + 7 = 15 or 16", 15, (7, 8), False),    # hedged between two results
    ("To solve this, we need the sum of 8 and", 15, (7, 8), False),  # cut off before any result
    ("It is 2,345.", 2345, (469, 5), True),
])
def test_number_right(answer: str, gold: int, operands: tuple[int, int], right: bool) -> None:
    assert number_right(answer, gold, operands) is right


def test_numbers_reads_thousands_commas_but_not_lists() -> None:
    assert numbers("1,234 and 5, 6 and 7.5") == [1234, 5, 6, 7]


def test_entity_matching_whole_names_longest_first() -> None:
    index = EntityIndex({"Sudan": (), "South Sudan": (), "Niger": (), "Nigeria": (), "Kyiv": ("Kiev",),
                         "Paris": (), "Canberra": (), "Sydney": ()})
    assert entity_right("South Sudan", "South Sudan", index)
    assert not entity_right("South Sudan", "Sudan", index)
    assert entity_right("The capital is Niger.", "Niger", index)
    assert not entity_right("Nigeria", "Niger", index)
    assert entity_right("The capital city of Ukraine is Kiev.", "Kyiv", index)
    assert entity_right("The capital of France is Paris.", "Paris", index)
    assert entity_right("Paris is the capital of France.", "Paris", index)
    assert not entity_right("Sydney or Canberra", "Canberra", index)
    assert not entity_right("I do not know.", "Paris", index)


def test_an_alias_shared_by_two_entities_is_refused() -> None:
    with pytest.raises(ValueError, match="ambiguous"):
        EntityIndex({"A": ("Same",), "B": ("same",)})


@pytest.mark.parametrize(("answer", "right"), [
    ("B", True), ("B. 4", True), ("The answer is (B)", True), ("A. I only\n\nThe answer is B", False),
    ("B4\n\nThe answer is B.", True), ("none", False),
])
def test_letter_right_reads_the_first_standalone_letter(answer: str, right: bool) -> None:
    assert letter_right(answer, "B") is right


def test_items_are_reproducible_and_accept_their_gold(tmp_path) -> None:
    mmlu = tmp_path / "mmlu.jsonl"
    mmlu.write_text("\n".join(json.dumps({"prompt": f"Q{i}?\nA. x\nB. y\nC. z\nD. w\nAnswer:", "answer": "C"})
                              for i in range(5)) + "\n")
    counts = {"capital": 5, "country": 5, "add_1d": 5, "mul_2x1d": 5, "mmlu": 3}
    a, b = make_items(counts, seed=3, mmlu_file=mmlu), make_items(counts, seed=3, mmlu_file=mmlu)
    assert [i.prompt for i in a] == [i.prompt for i in b] and len(a) == 23
    assert all(i.check(i.gold) for i in a)
    assert all(i.prompt.endswith(("Answer with one word.", "Reply with only the name.", "Answer with one number.",
                                  "Reply with only the number.", "Answer with one letter.")) for i in a)
    assert not any(i.check("I cannot answer that.") for i in a)

# -------------------------------------------------------------------------------------------- metrics


def test_auroc_by_hand() -> None:
    right = np.array([0, 0, 1, 1])
    assert auroc(np.array([1.0, 2, 3, 4]), right) == 1.0
    assert auroc(np.array([4.0, 3, 2, 1]), right) == 0.0
    assert auroc(np.array([1.0, 1, 1, 1]), right) == 0.5          # ties count half
    assert auroc(np.array([1.0, 3, 2, 4]), right) == 0.75         # 3 of the 4 (right, wrong) pairs in order
    assert auroc(np.array([-math.inf, 2, -math.inf, 4]), np.array([0, 1, 0, 1])) == 1.0
    assert math.isnan(auroc(np.array([1.0, 2]), np.array([1, 1])))


def test_kept_at_loss_by_hand() -> None:
    # keep scores, best first; the edge is wrong on the 3rd and 5th; the cloud is always right.
    score, edge, cloud = np.array([0.9, 0.8, 0.7, 0.6, 0.5]), np.array([1, 1, 0, 1, 0]), np.ones(5)
    assert kept_at_loss(score, edge, cloud, 0.0).kept == 0.4       # the two right ones before the first wrong
    r = kept_at_loss(score, edge, cloud, 0.2)                       # one wrong answer in five = 20 points
    assert (r.kept, r.loss, r.threshold) == (0.8, 0.2, 0.6)
    assert kept_at_loss(score, edge, cloud, 0.4).kept == 1.0
    assert at_threshold(score, edge, cloud, 0.6) == (0.8, 0.2)


def test_kept_at_loss_moves_ties_together() -> None:
    # The best-scored pair is tied and holds one wrong answer: no threshold keeps only the right one.
    score, edge, cloud = np.array([0.9, 0.9, 0.1]), np.array([1, 0, 0]), np.ones(3)
    assert kept_at_loss(score, edge, cloud, 0.0).kept == 0.0
    assert kept_at_loss(score, edge, cloud, 0.34).kept == pytest.approx(2 / 3)
    assert kept_at_loss(score, edge, cloud, 0.0).threshold == math.inf


def test_apgr_by_hand() -> None:
    # Escalating lowest first: PGR 0, .5, .5, 1, 1, 1 at shares 0, .2, ..., 1; trapezoid = 0.7.
    assert apgr(np.array([0.9, 0.8, 0.7, 0.6, 0.5]), np.array([1, 1, 0, 1, 0]), np.ones(5)) == pytest.approx(0.7)
    assert apgr(np.zeros(4), np.array([1, 0, 1, 0]), np.ones(4)) == pytest.approx(0.5)   # no signal
    assert math.isnan(apgr(np.arange(3.0), np.ones(3), np.ones(3)))                     # nothing to gain


def test_bootstrap_interval_of_a_constant_is_that_constant() -> None:
    assert bootstrap_ci(lambda idx: 0.25, 10, reps=20) == (0.25, 0.25)
    lo, hi = bootstrap_ci(lambda idx: float(np.mean(np.arange(10)[idx])), 10, reps=200)
    assert 0 <= lo < 4.5 < hi <= 9


def test_split_halves_every_task_reproducibly() -> None:
    tasks = ["a"] * 10 + ["b"] * 5
    calib, evals = split(tasks, seed=1)
    assert sorted([*calib, *evals]) == list(range(15))
    assert sum(tasks[i] == "a" for i in calib) == 5 and sum(tasks[i] == "b" for i in calib) == 2
    assert np.array_equal(split(tasks, seed=1)[0], calib)


def test_combination_skips_what_confidence_misses() -> None:
    # Confidence cannot tell the last four (confidently wrong) from the first four; the prompt score can.
    conf = np.array([0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.1, 0.1])
    prompt = np.array([0.0, 0, 0, 0, -1, -1, -1, -1, 0, 0])        # keep score: -1 = long / complex prompt
    edge = np.array([1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    combo = choose({"complexity": prompt}, {"mean logprob": conf}, edge, np.ones(10), np.arange(10))
    assert combo.skip_share == pytest.approx(0.4) and combo.prompt_signal == "complexity"
    assert combo.calibration_apgr > apgr(conf, edge, np.ones(10))
    assert list(combo.skipped(prompt)) == [False] * 4 + [True] * 4 + [False] * 2


# -------------------------------------------------------------------------------------- signals, report


def _answer(lps: list[float], finish: str = "stop", t0: float = 0.1) -> Answer:
    scores = [TokenScore(lp, lp - 1.0) for lp in lps]
    times = [t0 + 0.02 * i for i in range(len(lps))]
    return Answer("x", finish, scores, times, times[-1] + 0.01, 20, len(lps), 0.05 * len(lps))


def test_cut_answers_escalate_under_hold_but_not_first_k() -> None:
    sig = answer_signals([_answer([-0.1, -0.3]), _answer([-0.1, -0.2, -0.3], finish="length")])
    assert sig["mean logprob"][0] == pytest.approx(-0.2) and sig["min logprob"][0] == pytest.approx(-0.3)
    assert sig["mean margin"][0] == pytest.approx(1.0)
    assert sig["mean logprob"][1] == -math.inf and sig["finished (not cut)"][1] == 0.0
    assert sig["first-1 mean logprob"][1] == pytest.approx(-0.1)
    assert answer_signals([_answer([-0.1], finish="length")], cut_rule=False)["mean logprob"][0] == pytest.approx(-0.1)


def test_analysis_and_report_on_synthetic_answers() -> None:
    rng = np.random.default_rng(0)
    tasks = ["capital"] * 20 + ["mmlu"] * 20
    right = np.r_[rng.random(20) < 0.9, rng.random(20) < 0.2].astype(float)
    answers = [_answer([-0.05 if r else -1.0] * 3 + [-0.2], t0=0.1 + 0.1 * (i >= 20))
               for i, r in enumerate(right)]
    sig = answer_signals(answers)
    raw = answer_signals(answers, cut_rule=False)
    prompt = {"prompt tokens": -np.r_[np.full(20, 20.0), np.full(20, 90.0)],
              "complexity": -np.r_[rng.random(20) * 0.5, 0.5 + rng.random(20) * 0.5]}
    first_k = {1: {"n": 2, "cpu_s_mean": 0.1, "wall_s_mean": 0.1, "estimated_cpu_s_mean": 0.1}}
    res = analyse(tasks, right, answers, sig, {k: raw[k] for k in ("mean logprob",)}, prompt, seed=0, reps=20,
                  first_k_cpu=first_k, stand_in_right=right.copy())
    assert res["tasks"]["capital"]["auroc"]["mean logprob"] == 1.0
    assert {r["signal"] for r in res["signals"]} >= {"mean logprob", "complexity", "combined"}
    assert res["stand_in"]["agreement_with_edge"] == 1.0
    res |= {"command": "python -m bench.cascade", "wall_s": 60, "result_file": "bench/results/cascade.json",
            "machine": {"cpu_model": "cpu", "cores": 2, "mem_gib": 24, "load_start": 1.0, "load_end": 1.0},
            "settings": {"max_tokens": 16, "seed": 0, "concurrency": 1, "reps": 20},
            "edge": {"args": "--threads 1", "peak_rss_mib": 300.0}, "data": [], "notes": ["a note"],
            "combination_summary": "skip nothing"}
    text = markdown(res)
    assert text.startswith("## Cascade (bench/cascade)") and "| mean logprob | hold |" in text
    assert "a note" in text and "Second view" in text and "MMLU, the control" in text
