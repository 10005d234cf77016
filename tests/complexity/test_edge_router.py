"""The router's features and model file: deterministic, text-free features; an artifact that round-trips and refuses
what is not one."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tiergate.complexity.edge_router import (
    DENSE,
    HASH_BUCKETS,
    RouterArtifact,
    RouterFeatures,
    RouterModel,
    router_features,
)

MMLU = "Which gas do plants absorb?\nA. Oxygen\nB. Carbon dioxide\nC. Helium\nD. Neon\nAnswer:"


def _f(text: str, **kw) -> RouterFeatures:
    args = {"prompt_tokens": 40, "complexity": 0.3, "max_tokens": 64, "temperature": 0.0, "stream": False} | kw
    return router_features(text=text, **args)


def test_features_are_the_same_in_every_process_and_keep_no_text():
    a, b = _f(MMLU), _f(MMLU)
    assert a == b
    # crc32 buckets, not hash(): the bucket of a word is fixed (a model trained elsewhere reads the same columns)
    assert set(_f("carbon").words) == {__import__("zlib").crc32(b"carbon") % HASH_BUCKETS}
    dumped = json.dumps(a.to_json())
    assert "Oxygen" not in dumped and "carbon" not in dumped.lower()
    assert RouterFeatures.from_json(json.loads(dumped)).vector() == pytest.approx(a.vector(), abs=1e-5)


def test_lettered_options_are_a_feature_of_their_own():
    assert _f(MMLU).dense[5] == 1.0
    assert _f("What is the capital of France?").dense[5] == 0.0


def test_damaged_features_are_refused():
    for bad in (None, {"d": [1.0], "w": {}}, {"d": [0.0] * DENSE, "w": {str(HASH_BUCKETS): 1.0}}):
        with pytest.raises(ValueError):
            RouterFeatures.from_json(bad)


def _model(version: str, bias: float, trained_at: float = 0.0) -> RouterModel:
    return RouterModel(version, np.zeros(DENSE + HASH_BUCKETS), bias, meta={"trained_at": trained_at})


def test_a_model_predicts_a_calibrated_probability():
    w = np.zeros(DENSE + HASH_BUCKETS)
    w[5] = -4.0  # lettered options: the edge fails
    m = RouterModel("smollm2", w, 1.0, platt_a=1.0, platt_b=0.0)
    assert m.predict(_f(MMLU)) == pytest.approx(1 / (1 + np.exp(3.0)))
    assert m.predict(_f("What is the capital of France?")) == pytest.approx(1 / (1 + np.exp(-1.0)))


def test_an_artifact_round_trips_and_names_its_latest_other_version(tmp_path):
    path = tmp_path / "router.json"
    art = RouterArtifact({}).with_model(_model("v1", -1.0, 10)).with_model(_model("v2", 2.0, 20))
    art.save(path)
    back = RouterArtifact.load(path)
    assert sorted(back.models) == ["v1", "v2"] and back.get("v2").bias == 2.0
    assert back.latest_other("v3").edge_version == "v2" and back.latest_other("v2").edge_version == "v1"
    assert back.get("v3") is None


@pytest.mark.parametrize("doc, why", [
    ("{", "cannot read"),
    ('{"kind": "other"}', "not a tiergate edge router"),
    ('{"kind": "tiergate-edge-router", "features_version": 99, "models": {}}', "features version 99"),
    ('{"kind": "tiergate-edge-router", "features_version": 1, "models": {"v": {"weights": [1, 2]}}}', "weights"),
    ('{"kind": "tiergate-edge-router", "features_version": 1, "models": []}', "models"),
])
def test_what_is_not_a_router_artifact_is_refused_naming_the_file(tmp_path, doc, why):
    path = tmp_path / "router.json"
    path.write_text(doc)
    with pytest.raises(ValueError, match=why) as err:
        RouterArtifact.load(path)
    assert str(path) in str(err.value)


def test_a_missing_artifact_is_a_cold_start_not_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        RouterArtifact.load(tmp_path / "none.json")
