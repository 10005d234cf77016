"""The complexity model: the shipped file, its format, the shift guard and the calibration, by behaviour."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from tiergate.complexity.cli import classifier_app
from tiergate.complexity.features import FEATURES, as_messages
from tiergate.complexity.model import DEFAULT_MODEL_FILE, MODEL_FORMAT, ComplexityModel
from tiergate.complexity.train import read_labelled, source_weights, train

from .conftest import ROUTING, synthetic, write_jsonl

FILES = ("mmlu_dev.jsonl", "alpaca_eval_dev.jsonl", "arena_bench_dev.jsonl")
needs_data = pytest.mark.skipif(not all((ROUTING / f).exists() for f in FILES), reason="needs ../shared/data/routing")
MC = ("Statement 1 | Every group of order 4 is cyclic. Statement 2 | Z_4 is cyclic.\n"
      "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:")


@pytest.fixture(scope="module")
def model() -> ComplexityModel:
    return ComplexityModel.load_default()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> ComplexityModel:
    """Trained on three kinds of chat traffic, none with answer options."""
    tmp = tmp_path_factory.mktemp("chat")
    files = [write_jsonl(tmp / f"{k}.jsonl", synthetic(k, 240)) for k in ("chat", "writing", "lookup")]
    return train(read_labelled(files), expert=False)


def test_shipped_model_is_small_and_says_what_it_was_trained_on(model):
    assert DEFAULT_MODEL_FILE.stat().st_size < 1_000_000
    trained = model.meta["trained_on"]
    assert set(trained["sources"]) == {"mmlu_dev", "arena_bench", "alpaca_eval/selfinstruct", "alpaca_eval/oasst",
                                       "alpaca_eval/koala", "alpaca_eval/helpful_base"}
    assert [f["name"] for f in trained["files"]] == list(FILES)
    assert "CC BY-NC 4.0" in trained["license"] and "alpaca_eval" in trained["license"]
    assert model.expert is not None  # the training data had multiple-choice prompts


@pytest.mark.parametrize("text", ["", "hi", MC, "x" * 50_000, "日本語のテキスト", "\n\n\n", "A. a\nB. b"])
def test_scores_are_in_unit_interval_and_deterministic(model, text):
    s = model.score(text)
    assert 0.0 <= s <= 1.0 and s == model.score(text) == model.score([("user", text)])


def test_what_is_asked_for_moves_the_score(model):
    hard = "Write a Python function that parses a CSV file with quoted fields; do not use the csv module."
    easy = "What is the capital of France?"
    assert model.score(hard) > 0.7 > model.score(easy)


def test_multiple_choice_prompts_go_to_the_expert_and_others_do_not(model):
    assert model.explain(MC)["scored_by"] == "multiple-choice expert"
    assert model.explain("Pick a colour for my kitchen.")["scored_by"] == "head"


def test_explain_gives_the_score_and_its_parts(model):
    ex = model.explain("Compare quicksort and mergesort.")
    assert ex["score"] == round(model.score("Compare quicksort and mergesort."), 4)
    assert set(ex["features"]) == set(FEATURES) and len(ex["top_contributions"]) == 5
    assert 0.0 <= ex["trust"] <= 1.0 and 0 < ex["trusted_up_to"] < ex["untrusted_from"]


def test_save_and_load_round_trip(model, tmp_path):
    out = tmp_path / "m.json"
    model.save(out)
    assert out.read_bytes() == DEFAULT_MODEL_FILE.read_bytes()
    again = ComplexityModel.load(out)
    for text in ("hi", MC, "Explain step by step how a bicycle stays upright."):
        assert again.score(text) == model.score(text)


def _variant(tmp_path, change) -> object:
    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    change(d)
    p = tmp_path / "m.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("change,message", [
    (lambda d: d.update(format="tiergate-complexity/2"), "tiergate-complexity/2 file, this gateway reads"),
    (lambda d: d.update(format="something-else"), f"not a {MODEL_FORMAT}"),
    (lambda d: d.update(features=d["features"][:-1]), "other features"),
    (lambda d: d.update(tokenizer_sha256="0" * 64), "another tokenizer"),
    (lambda d: d["choice_expert"].update(vectors_sha256="0" * 64), "other word vectors"),
    (lambda d: d["guard"].update(precision=[[1.0]]), "guard precision"),
    (lambda d: d["calibration"].update(raw=[1.0, 0.0]), "calibration"),
    (lambda d: d.pop("head"), "incomplete model"),
])
def test_load_refuses_files_it_cannot_score_with_a_reason(tmp_path, change, message):
    with pytest.raises(ValueError, match=message) as info:
        ComplexityModel.load(_variant(tmp_path, change))
    assert "retrain" in str(info.value) or "not a" in str(info.value)


def test_load_refuses_what_is_not_json(tmp_path):
    p = tmp_path / "half.json"
    p.write_text('{"format": "tiergate-compl')
    with pytest.raises(ValueError, match="not a complexity model"):
        ComplexityModel.load(p)


def test_a_kind_of_prompt_never_seen_is_ranked_by_length(chat_model):
    """Answer options never occurred in training: the head is not trusted, and length alone decides."""
    short = "Which is largest?\nA. 1\nB. 2\nC. 3\nD. 4"
    unseen = [short, short.replace("Which", "Python code: which function"),  # code cues the head likes
              "Read this passage first. " * 12 + short, "Read this long passage first. " * 40 + short]
    parts = [chat_model.parts(chat_model.featurize(t)) for t in unseen]
    assert all(p.trust == 0.0 for p in parts)
    assert parts[0].score == pytest.approx(parts[1].score, abs=0.02)  # what the head would say does not count
    assert parts[1].raw < parts[2].raw < parts[3].raw  # longer escalates first ...
    assert parts[1].score <= parts[2].score <= parts[3].score  # (the percentile saturates above the reference)
    seen = chat_model.parts(chat_model.featurize(synthetic("chat", 1, seed=99)[0]["prompt"]))  # a known kind
    assert seen.trust == 1.0


def test_the_trained_head_ranks_the_kinds_it_learned(chat_model):
    hard = chat_model.score("Write a detailed essay of at least 800 words about tea, in five paragraphs.")
    easy = chat_model.score("Name a famous place with tea.")
    assert hard > easy


def test_calibration_puts_about_30_percent_of_the_reference_at_0_7_or_more(tmp_path):
    rows = [r for k in ("chat", "writing", "lookup") for r in synthetic(k, 300, seed=3)]
    rows += [dict(r, source="chat") for r in synthetic("chat", 300, seed=4)]  # one source bigger than the others
    data = read_labelled([write_jsonl(tmp_path / "mix.jsonl", rows)])
    m = train(data, expert=False)
    cx = np.array([m.score(c) for c in data.conversations])
    w = source_weights(data.source)
    assert np.average(cx >= 0.7, weights=w) == pytest.approx(0.30, abs=0.03)
    assert np.all(np.diff(m.calibration_raw) > 0) and m.calibrate(-1e9) == 0.0 and m.calibrate(1e9) == 1.0


@needs_data
def test_shipped_model_calibration_on_the_mixed_reference(model):
    data = read_labelled([ROUTING / f for f in FILES])
    cx = np.array([model.score(c) for c in data.conversations])
    w = source_weights(data.source)
    assert np.average(cx >= 0.7, weights=w) == pytest.approx(0.30, abs=0.02)
    for k in set(data.source.tolist()):
        assert 0.2 <= np.mean(cx[data.source == k] >= 0.7) <= 0.4, k


@needs_data
def test_shipped_model_is_reproduced_by_its_training_command(tmp_path):
    """complexity/complexity_model.json is exactly what the documented command writes (docs/policy.md)."""
    pytest.importorskip("sklearn")

    meta = json.loads(DEFAULT_MODEL_FILE.read_text())["meta"]
    out = tmp_path / "m.json"
    args = ["train", *[a for f in FILES for a in ("--data", str(ROUTING / f))], "--select",
            "--license", meta["trained_on"]["license"], "--out", str(out)]
    r = CliRunner().invoke(classifier_app, args)
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == DEFAULT_MODEL_FILE.read_bytes(), \
        "the shipped model is stale: retrain it with the command in docs/policy.md"


def test_messages_and_prompt_forms_agree(model):
    text = "Summarise the plot of Hamlet in two sentences."
    assert model.score(text) == model.score(as_messages({"messages": [{"role": "user", "content": text}]}))
