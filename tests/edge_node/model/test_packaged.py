"""Packaged models: a file that is missing, truncated or altered fails naming the file, both hashes and the fix."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from tiergate.edge_node.model.model_file import ModelFileError
from tiergate.edge_node.model.packaged import MODELS, PackagedModel, packaged_path, verify


def _model(path: Path, data: bytes) -> PackagedModel:
    return dataclasses.replace(MODELS["smollm2-135m-instruct"], name="test-model", size=len(data),
                               sha256=hashlib.sha256(data).hexdigest(), locate=lambda _m: path)


def test_the_pinned_file_passes(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(100))
    verify(_model(path, path.read_bytes()), path)


def test_an_altered_file_names_both_hashes_and_the_command_that_fixes_it(tmp_path):
    path = tmp_path / "m.gguf"
    good = b"GGUF" + bytes(100)
    model = _model(path, good)
    path.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    with pytest.raises(ModelFileError) as err:
        verify(model, path)
    msg = str(err.value)
    assert str(path) in msg and model.sha256 in msg and hashlib.sha256(path.read_bytes()).hexdigest() in msg
    assert "edge-node models install --force test-model" in msg


def test_a_truncated_or_missing_file_is_refused(tmp_path):
    path = tmp_path / "m.gguf"
    model = _model(path, b"GGUF" + bytes(100))
    path.write_bytes(b"GGUF")
    with pytest.raises(ModelFileError, match="has 4 bytes, expected 104"):
        verify(model, path)
    path.unlink()
    with pytest.raises(ModelFileError, match="does not exist"):
        verify(model, path)


def test_a_model_whose_package_is_absent_says_how_to_install_it(monkeypatch):
    absent = dataclasses.replace(MODELS["gemma-3-270m"], locate=lambda _m: None)
    monkeypatch.setitem(MODELS, "gemma-3-270m", absent)
    with pytest.raises(ModelFileError, match="edge-node models install gemma-3-270m"):
        packaged_path("gemma-3-270m")


def test_first_use_shows_the_license_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path))
    path = packaged_path("smollm2-135m-instruct")  # the real, installed file
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "Apache License 2.0" in capsys.readouterr().err
    packaged_path("smollm2-135m-instruct")
    assert "Apache License 2.0" not in capsys.readouterr().err
