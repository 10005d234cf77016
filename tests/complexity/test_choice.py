"""The multiple-choice expert: its features and its compiled trees (its word vectors: test_word_vectors.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tiergate.complexity.choice import CHOICE_FEATURES, ChoiceFeaturizer
from tiergate.complexity.encoder import Encoder
from tiergate.complexity.trees import DEFAULT_PARAMS, export, fit_trees, interp, negate_and_join

MC = ("Statement 1 | Every group of order 4 is cyclic. Statement 2 | Z_4 is cyclic.\n"
      "A. True, True\nB. False, False\nC. True, False\nD. False, True\nAnswer:")


@pytest.fixture(scope="module")
def featurizer() -> ChoiceFeaturizer:
    return ChoiceFeaturizer.for_encoder(Encoder.default())


def named(f: ChoiceFeaturizer, text: str) -> dict[str, float]:
    return dict(zip(CHOICE_FEATURES, f.values(text), strict=True))


def test_features_describe_the_question_and_its_options(featurizer):
    f = named(featurizer, MC)
    assert f["n_options"] == 4 and f["parts"] == 2 and f["compound_options"] == 1.0
    assert f["verdict_options"] == 1.0 and f["option_repetition"] > 0.5
    plain = named(featurizer, "What is the capital of France?")
    assert plain["n_options"] == 0 and plain["log_option_chars"] == 0 and plain["verdict_options"] == 0
    assert named(featurizer, "Which is a noble gas?\nA. Neon\nB. Iron\nC. Tin\nD. Lead")["verdict_options"] == 0


def test_option_similarity_tells_near_synonyms_from_unrelated_options(featurizer):
    def sim(options: list[str]) -> dict[str, float]:
        return named(featurizer, "Which word fits?\n" + "\n".join(f"{'ABCD'[i]}. {o}" for i, o in enumerate(options)))

    close = sim(["happy", "glad", "cheerful", "joyful"])
    far = sim(["happy", "volcano", "seventeen", "carburetor"])
    assert 0 < far["option_similarity"] < close["option_similarity"] <= close["option_similarity_max"] <= 1 + 1e-9
    assert sim(["x", "x", "y", "z"])["option_similarity_max"] == pytest.approx(1.0)
    many = "Q?\n" + "\n".join(f"A. option {i}" for i in range(500))  # the quadratic part is bounded
    assert 0 < named(featurizer, many)["option_similarity"] <= 1 + 1e-9


def test_passing_ids_gives_the_same_features(featurizer):
    for text in (MC, "", "Ünïcödé ## [UNK] 12345 " * 50):
        assert featurizer.values(text, featurizer.encoder.encode(text)) == featurizer.values(text)


def test_compiled_trees_match_scikit_learn():
    pytest.importorskip("sklearn")
    # optional dependency: scikit-learn (dev extra); skipped above when absent
    from sklearn.ensemble import HistGradientBoostingRegressor

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6))
    y = np.tanh(x[:, 0] * 2 - x[:, 3]) + 0.1 * rng.normal(size=400)
    est = HistGradientBoostingRegressor(early_stopping=False, **DEFAULT_PARAMS).fit(x, y)
    trees = export(est)
    assert np.allclose([trees.predict(row) for row in x], est.predict(x), atol=1e-9)


def test_joined_ensembles_predict_the_difference():
    pytest.importorskip("sklearn")

    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 5))
    a = fit_trees(x, (x[:, 0] + rng.normal(size=500) > 0).astype(float))
    b = fit_trees(x, (x[:, 1] + rng.normal(size=500) > 0.5).astype(float))
    joined = negate_and_join(a, b)
    assert np.allclose([joined.predict(r) for r in x[:50]], [a.predict(r) - b.predict(r) for r in x[:50]], atol=1e-12)


def test_interp_is_numpys():
    xs = np.array([-1.0, 0.0, 0.25, 0.25000001, 2.0])
    ys = np.array([0.0, 0.1, 0.5, 0.6, 1.0])
    probes = [-5.0, -1.0, -0.5, 0.0, 0.1, 0.25, 0.250000005, 1.0, 2.0, 3.0, *np.linspace(-2, 3, 101)]
    assert [interp(xs.tolist(), ys.tolist(), float(p)) for p in probes] == [float(np.interp(p, xs, ys)) for p in probes]
