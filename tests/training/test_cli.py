"""`python -m tiergate.training` refuses bad input with one line naming the file, before loading any model."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tiergate.training.cli import app

runner = CliRunner()


def test_train_names_the_bad_line_of_an_export(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    export = tmp_path / "x.jsonl"
    export.write_text('{"prompt": "a", "completion": "b"}\n{"messages": 3}\n')
    r = runner.invoke(app, ["train", str(export), "--model", str(model), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and f"{export}:2: field 'messages'" in r.output
    assert not (tmp_path / "o").exists()


def test_train_refuses_a_missing_model_and_an_export_with_nothing_to_train_on(tmp_path: Path) -> None:
    export = tmp_path / "x.jsonl"
    export.write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    r = runner.invoke(app, ["train", str(export), "--model", str(tmp_path / "none.gguf"), "--out", str(tmp_path)])
    assert r.exit_code == 2 and "none.gguf: no such file" in r.output
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    r = runner.invoke(app, ["train", str(export), "--model", str(model), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "no training rows left" in r.output  # one row: it is the newest, so held out


def test_gate_refuses_missing_files(tmp_path: Path) -> None:
    rows = tmp_path / "h.jsonl"
    rows.write_text("")
    r = runner.invoke(app, ["gate", "--model", str(tmp_path / "m.gguf"), "--adapter", str(tmp_path / "a.gguf"),
                            "--heldout", str(rows), "--regression", str(rows), "--out", str(tmp_path / "v.json")])
    assert r.exit_code == 2 and "--model" in r.output and "no such file" in r.output
