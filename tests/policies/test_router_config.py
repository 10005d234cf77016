"""The policy's `router` section and the `edge_success` condition: validated with file, line and field; a rule on
`edge_success` never matches without a prediction (cold start: the decision is what it is without the rule)."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tiergate.complexity.cli import classifier_app
from tiergate.complexity.edge_router import DENSE, HASH_BUCKETS, RouterArtifact, RouterModel
from tiergate.core.types import Features, Priority
from tiergate.policies.cli import policy_app
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import PolicyError, load_policy

ROUTED = """\
version: 1
tiers:
  edge: {kind: edge, model: tiergate-edge, tokenizer: builtin:default}
  cloud: {kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:8090"]}
router:
  model: router.json
  explore: 0.1
rules:
  - name: predicted-failure
    when: {edge_success: {max: 0.2}}
    tier: cloud
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {min_mean_logprob: -1.0}
"""
WITHOUT_RULE = ROUTED.replace("""  - name: predicted-failure
    when: {edge_success: {max: 0.2}}
    tier: cloud
""", "")


def _features(edge_success: float | None = None) -> Features:
    return Features(prompt_tokens=30, priority=Priority.NORMAL, complexity=0.4, requested_model="auto",
                    tenant="t", text="hello", edge_success=edge_success)


def _load(tmp_path: Path, text: str):
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return load_policy(path)


def test_cold_start_decides_exactly_as_without_the_router_rule(tmp_path):
    with_rule = PolicyEngine(_load(tmp_path, ROUTED))  # router.json does not exist: a warning, not an error
    without = PolicyEngine(_load(tmp_path, WITHOUT_RULE))
    assert with_rule.decide(_features()) == dataclasses.replace(without.decide(_features()))
    assert with_rule.decide(_features()).rule == "cascade"


@pytest.mark.parametrize("p, rule", [(0.05, "predicted-failure"), (0.2, "predicted-failure"), (0.21, "cascade"),
                                     (0.9, "cascade")])
def test_a_predicted_failure_goes_to_the_cloud_and_the_uncertain_band_keeps_the_cascade(tmp_path, p, rule):
    engine = PolicyEngine(_load(tmp_path, ROUTED))
    assert engine.decide(_features(p)).rule == rule


def test_explain_shows_the_prediction_or_its_absence(tmp_path):
    engine = PolicyEngine(_load(tmp_path, ROUTED))
    cold = engine.explain(_features()).to_dict()
    assert cold["rules"][0]["checks"][0] == {"condition": "edge_success <= 0.2", "held": False,
                                             "observed": "edge_success = none (no router model)"}
    assert cold["features"]["edge_success"] is None
    assert engine.explain(_features(0.1)).to_dict()["rules"][0]["outcome"] == "matched"


def test_a_missing_model_is_a_warning_that_says_cold_start(tmp_path):
    policy = _load(tmp_path, ROUTED)
    assert any("cold start" in w for w in policy.warnings)


def test_a_model_that_does_not_load_is_an_error_at_its_line(tmp_path):
    (tmp_path / "router.json").write_text('{"kind": "nope"}')
    with pytest.raises(PolicyError) as err:
        _load(tmp_path, ROUTED)
    assert "policy.yaml:6" in str(err.value) and "not a tiergate edge router" in str(err.value)


def test_a_valid_model_loads_without_warning(tmp_path):
    RouterArtifact({"v": RouterModel("v", np.zeros(DENSE + HASH_BUCKETS), 0.0)}).save(tmp_path / "router.json")
    assert not any("router" in w for w in _load(tmp_path, ROUTED).warnings)


@pytest.mark.parametrize("text, where, says", [
    (WITHOUT_RULE.replace("router:\n  model: router.json\n  explore: 0.1\n", "").replace(
        "rules:\n", "rules:\n  - name: r\n    when: {edge_success: {max: 0.2}}\n    tier: cloud\n"),
     "rules[0].when.edge_success", "needs a `router:` section"),
    (ROUTED.replace("explore: 0.1", "explore: 0.1\n  edge_tier: cloud"), "router.edge_tier", "not an edge tier"),
    (ROUTED.replace("explore: 0.1", "explore: 0.1\n  judge_rule: predicted-failure"), "router.judge_rule",
     "not a cascade rule"),
    (ROUTED.replace("explore: 0.1", "explore: 1.5"), "router.explore", "less than or equal to 1"),
    (ROUTED.replace("{max: 0.2}", "{max: 1.2}"), "edge_success.max", "less than or equal to 1"),
    (ROUTED.replace("explore: 0.1", "explore: 0.1\n  surprise: 1"), "router.surprise", ""),
])
def test_mistakes_are_errors_naming_the_field(tmp_path, text, where, says):
    with pytest.raises(PolicyError) as err:
        _load(tmp_path, text)
    assert where in str(err.value) and says in str(err.value)


def test_exploration_needs_a_cascade_to_judge_by(tmp_path):
    text = ROUTED.replace("    cascade: {min_mean_logprob: -1.0}\n", "")
    with pytest.raises(PolicyError, match="add one or set explore: 0"):
        _load(tmp_path, text)
    assert _load(tmp_path, text.replace("explore: 0.1", "explore: 0")).router.explore == 0


def test_a_later_rule_on_the_same_band_is_reported_unreachable(tmp_path):
    text = ROUTED.replace("  - name: cascade\n", "  - name: again\n    when: {edge_success: {max: 0.1}}\n"
                                                  "    tier: cloud\n  - name: cascade\n")
    with pytest.raises(PolicyError, match="unreachable"):
        _load(tmp_path, text)


def _traffic(tmp_path: Path) -> Path:
    lines = [{"prompt": "Which is a metal?\nA. iron\nB. water\nC. air\nD. wood\nAnswer:", "source": "mmlu"},
             {"prompt": "Say hello to my friend.", "source": "chat"}]
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _simulate(tmp_path: Path, *extra: str) -> list[dict]:
    r = CliRunner().invoke(policy_app, ["simulate", str(tmp_path / "policy.yaml"), str(_traffic(tmp_path)), *extra])
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.output.splitlines()]


def test_simulate_shows_what_the_learned_router_would_do(tmp_path):
    _load(tmp_path, ROUTED)
    cold = _simulate(tmp_path)
    assert [row["rule"] for row in cold[:2]] == ["cascade", "cascade"] and "edge_success" not in cold[0]
    assert cold[-1]["totals"]["router"]["model"] is False and "cold start" in cold[-1]["totals"]["router"]["note"]
    w = np.zeros(DENSE + HASH_BUCKETS)
    w[5] = -6.0  # lettered options: the edge fails
    RouterArtifact({"tiergate-edge": RouterModel("tiergate-edge", w, 2.0)}).save(tmp_path / "router.json")
    rows = _simulate(tmp_path)
    assert rows[0]["rule"] == "predicted-failure" and rows[0]["edge_success"] < 0.2
    assert rows[1]["rule"] == "cascade" and rows[1]["edge_success"] > 0.8
    router = rows[-1]["totals"]["router"]
    assert router == {"edge_version": "tiergate-edge", "model": True, "predicted": 2,
                      "decided_by_edge_success_rules": 1, "share_decided_by_edge_success_rules": 0.5, "note": None}
    other = _simulate(tmp_path, "--edge-version", "v9")  # a version without a model: a cold start
    assert other[0]["rule"] == "cascade" and other[-1]["totals"]["router"]["edge_version"] == "v9"


def test_graded_traffic_becomes_outcomes_that_train_a_router_simulate_follows(tmp_path):
    _load(tmp_path, ROUTED)
    subjects = ["metal", "gas", "planet", "river", "king", "cell", "rock", "cloud", "tree", "bird"]
    lines = []
    rng = random.Random(3)  # labels drawn, not periodic: a pattern in step with the trainer's folds is unlearnable
    for i in range(120):
        s = subjects[i % len(subjects)]
        if i % 2:
            lines.append({"prompt": f"Which is a {s} ({i})?\nA. one\nB. two\nC. three\nD. four\nAnswer:",
                          "stood": rng.random() < 0.05})
        else:
            lines.append({"prompt": f"Say hello to my friend who likes the {s} number {i}.",
                          "stood": rng.random() < 0.9})
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = CliRunner().invoke(policy_app, ["outcomes", str(tmp_path / "policy.yaml"), str(graded),
                                        "--edge-version", "tiergate-edge"])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in r.output.splitlines()]
    assert len(records) == 120 and {x["source"] for x in records} == {"graded"}
    assert "hello" not in r.output and "Answer" not in r.output  # features, not text
    outcomes = tmp_path / "outcomes.jsonl"
    outcomes.write_text(r.output)
    r = CliRunner().invoke(classifier_app, ["train", "--from-outcomes", str(outcomes),
                                            "--out", str(tmp_path / "router.json")])
    assert r.exit_code == 0, r.output
    rows = _simulate(tmp_path)
    assert rows[0]["rule"] == "predicted-failure" and rows[1]["rule"] == "cascade"


def test_a_graded_line_without_its_label_is_skipped_and_said(tmp_path):
    _load(tmp_path, ROUTED)
    graded = tmp_path / "graded.jsonl"
    graded.write_text('{"prompt": "hi", "stood": true, "edge_version": "v"}\n{"prompt": "hi"}\n')
    r = CliRunner().invoke(policy_app, ["outcomes", str(tmp_path / "policy.yaml"), str(graded)])
    assert r.exit_code == 1 and "graded.jsonl:2: skipped: needs `stood`" in r.output
