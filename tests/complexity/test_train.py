"""Training: reading operators' labelled data, reproducibility, the expert, design selection, invariance."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiergate.complexity.apgr import apgr
from tiergate.complexity.model import ComplexityModel, Design
from tiergate.complexity.select import GRID, select_design
from tiergate.complexity.train import read_labelled, source_weights, train

from .conftest import multiple_choice, synthetic, write_jsonl


def test_reading_accepts_prompts_messages_booleans_and_fractions(tmp_path):
    rows = [
        {"prompt": "a", "weak_correct": True, "strong_correct": False},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "b"}],
         "weak_correct": 0.25, "strong_correct": 1, "source": "support"},
        {"prompt": "c", "weak_correct": 1.5, "strong_correct": 0.5},  # out of range
        {"prompt": "d", "weak_correct": "yes", "strong_correct": 0.5},  # not a quality
        {"messages": "e", "weak_correct": 0.5, "strong_correct": 0.5},  # not a message list
        {"prompt": "f", "weak_correct": 0, "strong_correct": 1, "source": 7},  # source not a string
    ]
    path = tmp_path / "ops.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n\n")
    data = read_labelled([path])
    assert data.conversations == [[("user", "a")], [("system", "be brief"), ("user", "b")]]
    assert data.weak.tolist() == [1.0, 0.25] and data.strong.tolist() == [0.0, 1.0]
    assert data.source.tolist() == ["ops", "support"]  # the file's name unless the line names its source
    assert [n for _, n, _ in data.errors] == [3, 4, 5, 6, 7]
    assert data.files[0]["rows"] == 2 and data.files[0]["skipped_lines"] == 5 and len(data.files[0]["sha256"]) == 64


@pytest.fixture(scope="module")
def three_kinds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kinds")
    return [write_jsonl(tmp / f"{k}.jsonl", synthetic(k, 200)) for k in ("chat", "writing", "lookup")]


def test_training_is_reproducible_and_learns_each_kind(three_kinds, tmp_path):
    outs = []
    for name in ("a.json", "b.json"):
        train(read_labelled(three_kinds), expert=False).save(tmp_path / name)
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    m = ComplexityModel.load(tmp_path / "a.json")
    held = [r for k in ("chat", "writing", "lookup") for r in synthetic(k, 60, seed=9)]  # new prompts
    scores = np.array([m.score(r["prompt"]) for r in held])
    weak, strong = np.array([r["weak_correct"] for r in held]), np.array([r["strong_correct"] for r in held])
    assert apgr(scores, weak, strong) > 0.7


def test_fractional_labels_rank_by_the_expected_gain(tmp_path):
    """Every prompt is "right" for both models by a 0.5 cut; only the judge scores say which gain."""
    rows = synthetic("chat", 300)
    for r in rows:
        r["weak_correct"], r["strong_correct"] = (0.55, 0.95) if "Python" in r["prompt"] else (0.9, 0.9)
    m = train(read_labelled([write_jsonl(tmp_path / "judged.jsonl", rows)]), expert=False)
    assert m.score("Write a Python function that parses a JSON list of tea; do not use any library.") > \
        m.score("Do you like tea? please")


def test_messages_are_trained_on_as_conversations(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": r["prompt"]}], **{k: r[k] for k in r if k != "prompt"}}
            for r in synthetic("writing", 200)]
    m = train(read_labelled([write_jsonl(tmp_path / "chats.jsonl", rows)]), expert=False)
    assert m.meta["trained_on"]["sources"]["writing"]["rows"] == 200
    long_ask = "Write a detailed essay of at least 700 words about birds, in five paragraphs, each with three."
    assert m.score([("system", "You are a helpful assistant."), ("user", long_ask)]) > \
        m.score([("system", "You are a helpful assistant."), ("user", "Name a famous place with birds.")])


def test_the_expert_is_trained_only_with_enough_multiple_choice_prompts(tmp_path):
    pytest.importorskip("sklearn")
    chat = synthetic("chat", 200)
    few = train(read_labelled([write_jsonl(tmp_path / "few.jsonl", chat + multiple_choice(100))]))
    assert few.expert is None and few.meta["choice_expert_rows"] == 0
    many = train(read_labelled([write_jsonl(tmp_path / "many.jsonl", chat + multiple_choice(400))]))
    assert many.expert is not None and many.meta["choice_expert_rows"] == 400
    verdict = "Statement 1 | Every tea is blue. Statement 2 | Some tea are 3.\nA. True, True\nB. False, False\n" \
              "C. True, False\nD. False, True\nAnswer:"
    recall = "Which of these is a tea?\nA. a tea\nB. a stone\nC. a cloud\nD. a number\nAnswer:"
    assert many.explain(verdict)["scored_by"] == "multiple-choice expert"
    assert many.score(verdict) > many.score(recall)
    without = train(read_labelled([write_jsonl(tmp_path / "many.jsonl", chat + multiple_choice(400))]), expert=False)
    plain = "Do you like tea?"
    assert many.explain(plain)["scored_by"] == "head"
    assert many.parts(many.featurize(plain)).raw == without.parts(without.featurize(plain)).raw  # untouched


def test_design_selection_uses_the_training_sources_and_says_how(three_kinds):
    data = read_labelled(three_kinds)
    h = ComplexityModel.load_default().featurizer.matrix(data.conversations)
    design, info = select_design(h, data.weak, data.strong, data.source)
    assert design in GRID and info["designs_tried"] == len(GRID)
    assert set(info["inner_apgr"]) == {"chat", "writing", "lookup"}
    rows = data.source != "lookup"
    with pytest.raises(ValueError, match="at least 3 sources"):
        select_design(h, data.weak, data.strong, data.source, rows=rows)
    m = train(data, select=True, expert=False)
    assert m.meta["selection"]["inner_mean"] == info["inner_mean"] and m.design == design


def test_invariance_keeps_one_kind_of_traffic_from_taking_the_cloud_share(tmp_path):
    """Writing prompts are long and full of constraints, yet gain no more than the others on average: without
    the penalty the head learns "writing gains" from the mix and sends most writing to the cloud."""
    rows = synthetic("chat", 300) + synthetic("writing", 300) + synthetic("lookup", 300)
    for r in rows:
        if r["source"] == "writing":
            r["weak_correct"], r["strong_correct"] = (0.2, 0.9) if len(r["prompt"]) > 90 else (0.75, 0.9)
        else:
            r["weak_correct"], r["strong_correct"] = (0.8, 0.9) if "Python" not in r["prompt"] else (0.5, 0.9)
    data = read_labelled([write_jsonl(tmp_path / "mix.jsonl", rows)])

    def spread(design: Design) -> float:
        m = train(data, design, expert=False)
        cx = np.array([m.score(c) for c in data.conversations])
        shares = [np.mean(cx[data.source == k] >= 0.7) for k in ("chat", "writing", "lookup")]
        assert np.average(cx >= 0.7, weights=source_weights(data.source)) == pytest.approx(0.3, abs=0.05)
        return max(shares) - min(shares)

    assert spread(Design(invariance=100.0)) < spread(Design(invariance=0.0))
