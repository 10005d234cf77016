"""Training the router from outcome records: it learns what the records say, is calibrated on held-out folds,
starts from a prior, and the CLI writes an artifact that keeps the other versions' models."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from typer.testing import CliRunner

from tiergate.complexity.cli import classifier_app
from tiergate.complexity.edge_router import FEATURES_VERSION, RouterArtifact, RouterModel, router_features
from tiergate.complexity.router_train import L2_GRID, cutoff_table, fit_router, read_outcomes

SUBJECTS = ["plants", "rivers", "planets", "metals", "kings", "cells", "rocks", "clouds"]


def _prompt(rng: random.Random, mmlu: bool) -> str:
    s = rng.choice(SUBJECTS)
    if mmlu:
        return f"Which of these is true of {s}?\nA. one\nB. two\nC. three\nD. four\nAnswer:"
    return f"Say hello to my friend who likes {s}."


def records(n: int, version: str = "smollm2", seed: int = 0, mmlu_stands: float = 0.1,
            other_stands: float = 0.9) -> list[dict]:
    """Outcome records as the gateway writes them: MMLU-like prompts mostly fail on the edge, others stand."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        mmlu = rng.random() < 0.5
        text = _prompt(rng, mmlu)
        f = router_features(prompt_tokens=len(text) // 4, complexity=rng.random(), max_tokens=32, temperature=0,
                            stream=False, text=text)
        stood = rng.random() < (mmlu_stands if mmlu else other_stands)
        out.append({"ts": 0, "label": int(stood), "edge_version": version, "fv": FEATURES_VERSION,
                    "features": f.to_json(), "tenant": "t", "rule": "cascade", "reason": "confident" if stood
                    else "low_mean_logprob", "source": "cascade"})
    return out


def _write(path, recs) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return str(path)


def _p(model: RouterModel, mmlu: bool, seed: int = 99) -> float:
    text = _prompt(random.Random(seed), mmlu)
    return model.predict(router_features(prompt_tokens=len(text) // 4, complexity=0.5, max_tokens=32,
                                         temperature=0, stream=False, text=text))


def test_the_router_learns_where_the_edge_fails_and_is_calibrated(tmp_path):
    data, version = read_outcomes(_write(tmp_path / "o.jsonl", records(600)), None)
    assert version == "smollm2" and len(data.y) == 600
    model = fit_router(data, version)
    assert _p(model, mmlu=True) < 0.25 < 0.75 < _p(model, mmlu=False)
    # calibrated: the mean prediction on fresh records is near their share that stood
    fresh, _ = read_outcomes(_write(tmp_path / "f.jsonl", records(400, seed=7)), None)
    preds = [model.predict(router_features(prompt_tokens=0, complexity=0, max_tokens=None, temperature=None,
                                           stream=False, text="")) for _ in range(1)]
    assert 0 < preds[0] < 1
    logits = fresh.x @ model.weights + model.bias
    p = 1 / (1 + np.exp(-(model.platt_a * logits + model.platt_b)))
    assert abs(p.mean() - fresh.y.mean()) < 0.05
    assert model.meta["held_out"]["auc"] > 0.8 and model.meta["outcomes"] == 600


def test_unusable_records_are_skipped_and_counted(tmp_path):
    recs = records(40)
    recs[0]["fv"] = 99
    recs[1]["label"] = 2
    recs[2]["reason"] = "first_tier_failed"  # the edge was down: says nothing about the prompt
    path = tmp_path / "o.jsonl"
    path.write_text("not json\n" + "".join(json.dumps(r) + "\n" for r in recs))
    data, _ = read_outcomes(str(path), "smollm2")
    assert len(data.y) == 37 and data.skipped == 4


def test_one_label_only_cannot_make_a_router(tmp_path):
    data, version = read_outcomes(_write(tmp_path / "o.jsonl", records(100, mmlu_stands=1, other_stands=1)), None)
    with pytest.raises(ValueError, match="both labels"):
        fit_router(data, version)


def test_a_new_version_starts_from_the_previous_versions_model(tmp_path):
    old, _ = read_outcomes(_write(tmp_path / "old.jsonl", records(800, version="v1")), "v1")
    prior = fit_router(old, "v1")
    # a few of the new version's outcomes, all of plain prompts: alone, they know nothing of MMLU-like ones
    few = [r for r in records(200, version="v2", seed=3) if r["features"]["d"][5] == 0][:60]
    data, _ = read_outcomes(_write(tmp_path / "new.jsonl", few), "v2")
    with_prior = fit_router(data, "v2", prior=prior)
    without = fit_router(data, "v2")
    assert with_prior.meta["prior_version"] == "v1"
    assert _p(with_prior, mmlu=True) < 0.5 < _p(without, mmlu=True)


def test_the_cli_trains_from_outcomes_and_keeps_other_versions(tmp_path):
    out = tmp_path / "router.json"
    runner = CliRunner()
    src = _write(tmp_path / "v1.jsonl", records(300, version="v1"))
    r = runner.invoke(classifier_app, ["train", "--from-outcomes", src, "--out", str(out)])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.output)
    assert printed["edge_version"] == "v1"
    assert [row["max"] for row in printed["cutoffs"]] == [round(0.05 * i, 2) for i in range(1, 11)]
    src2 = _write(tmp_path / "v2.jsonl", records(300, version="v2", seed=5))
    r = runner.invoke(classifier_app, ["train", "--from-outcomes", src2, "--out", str(out), "--edge-version", "v2"])
    assert r.exit_code == 0, r.output
    art = RouterArtifact.load(out)
    assert sorted(art.models) == ["v1", "v2"] and art.get("v2").meta["prior_version"] == "v1"


def test_the_cli_says_why_it_cannot_train(tmp_path):
    runner = CliRunner()
    src = _write(tmp_path / "o.jsonl", records(20))
    r = runner.invoke(classifier_app, ["train", "--from-outcomes", src, "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "20 outcomes" in r.output and "need at least 50" in r.output
    r = runner.invoke(classifier_app, ["train", "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "--from-outcomes" in r.output
    r = runner.invoke(classifier_app, ["train", "--from-outcomes", str(tmp_path / "none.jsonl"),
                                       "--out", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "cannot read the outcomes" in r.output


def test_the_regularisation_is_chosen_on_held_out_folds(tmp_path):
    data, version = read_outcomes(_write(tmp_path / "o.jsonl", records(600)), None)
    model = fit_router(data, version)
    losses = model.meta["l2_held_out_log_loss"]
    assert set(losses) == {str(g) for g in L2_GRID} and len(set(losses.values())) > 1  # each one really tried
    assert losses[str(model.meta["l2"])] == min(losses.values())
    fixed = fit_router(data, version, l2=1.0)
    assert fixed.meta["l2_held_out_log_loss"].keys() == {"1.0"}
    if model.meta["l2"] != 1.0:  # the chosen strength is the one the final fit used
        assert not np.allclose(fixed.weights, model.weights)


def test_the_cutoff_table_says_what_each_max_would_send_away_and_cost():
    p = np.array([0.05, 0.1, 0.2, 0.3, 0.6, 0.9])
    y = np.array([0.0, 0.0, 1.0, 0.0, 1.0, 1.0])
    table = {row["max"]: row for row in cutoff_table(p, y)}
    assert table[0.05] == {"max": 0.05, "routed": round(1 / 6, 4), "stood_routed": 0.0}
    assert table[0.2] == {"max": 0.2, "routed": 0.5, "stood_routed": round(1 / 3, 4)}
    assert table[0.5]["routed"] == round(4 / 6, 4)


def test_a_trained_model_rates_the_cutoffs_on_its_held_out_predictions(tmp_path):
    data, version = read_outcomes(_write(tmp_path / "o.jsonl", records(600)), None)
    table = fit_router(data, version).meta["cutoffs"]
    routed = [row["routed"] for row in table]
    assert routed == sorted(routed) and 0.3 < routed[-1] < 0.7  # about the MMLU-like half goes at max 0.5
    assert table[-1]["stood_routed"] < 0.15  # and few of the answers that stood go with it


def test_repeats_of_a_prompt_never_sit_on_both_sides_of_a_held_out_split(tmp_path):
    # 40 prompts of random words, each asked 10 times and standing or not by a coin flipped once per prompt:
    # nothing generalises, so held out the router must look no better than chance, however well it remembers
    rng = random.Random(11)
    words = [f"w{i}" for i in range(300)]
    prompts = [(" ".join(rng.sample(words, 6)), rng.random() < 0.5) for _ in range(40)]
    recs = []
    for _ in range(10):
        for text, stood in prompts:
            f = router_features(prompt_tokens=6, complexity=0.5, max_tokens=32, temperature=0, stream=False,
                                text=text)
            recs.append({"ts": 0, "label": int(stood), "edge_version": "v", "fv": FEATURES_VERSION,
                         "features": f.to_json(), "tenant": "t", "rule": "r", "reason": "x", "source": "cascade"})
    rng.shuffle(recs)  # repeats arrive in any order, as traffic's do
    data, version = read_outcomes(_write(tmp_path / "o.jsonl", recs), None)
    model = fit_router(data, version)
    assert model.meta["held_out"]["auc"] < 0.7  # split by position, each prompt on both sides: above 0.95


def _graded(recs: list[dict]) -> list[dict]:
    return [r | {"source": "agreement", "reason": "escalation"} for r in recs]


def test_graded_labels_replace_the_cascades_once_there_are_enough(tmp_path):
    # The cascade kept MMLU's fluent guesses (they "stood"); judged against the cloud, most were wrong.
    cascade = records(400, seed=1, mmlu_stands=0.8)
    graded = _graded(records(300, seed=2, mmlu_stands=0.1))
    path = _write(tmp_path / "o.jsonl", cascade + graded)
    few, _ = read_outcomes(path, None, min_graded=301)
    assert (few.labels, few.graded, len(few.y), few.versions) == ("all", 300, 700, {"smollm2": 700})
    enough, version = read_outcomes(path, None, min_graded=300)
    assert (enough.labels, enough.graded, len(enough.y)) == ("graded", 300, 300)
    on_all, on_graded = fit_router(few, version), fit_router(enough, version)
    assert _p(on_graded, mmlu=True) < 0.3 < _p(on_all, mmlu=True)  # graded alone: MMLU fails on the edge


def test_the_cli_says_which_labels_it_trained_on(tmp_path):
    path = _write(tmp_path / "o.jsonl", records(100, seed=1) + _graded(records(250, seed=2)))
    out = tmp_path / "router.json"
    result = CliRunner().invoke(classifier_app, ["train", "--from-outcomes", path, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert (summary["labels"], summary["graded_records"], summary["outcomes"]) == ("graded", 250, 250)
    assert RouterArtifact.load(out).get("smollm2").meta["labels"] == "graded"
    result = CliRunner().invoke(classifier_app, ["train", "--from-outcomes", path, "--out", str(out),
                                                 "--min-graded", "1000"])
    assert result.exit_code == 0, result.output
    assert (json.loads(result.output)["labels"], json.loads(result.output)["outcomes"]) == ("all", 350)


def test_a_verified_kept_answer_stands_for_the_kept_answers_not_verified(tmp_path):
    kept = [r | {"label": 1} for r in records(300, seed=3)]  # the cascade kept 300 answers, verified 25 of them
    verified = [r | {"reason": "verify"} for r in _graded(records(25, seed=4))]
    path = _write(tmp_path / "o.jsonl", kept + _graded(records(250, seed=5)) + verified)
    data, _ = read_outcomes(path, None, min_graded=200)
    assert (data.labels, data.graded, len(data.y)) == ("graded", 275, 250 + 25 * 12)
    unweighted, _ = read_outcomes(_write(tmp_path / "v.jsonl", _graded(records(250, seed=5)) + verified), None)
    assert len(unweighted.y) == 275  # no cascade records to say how many were kept: each counts once
