"""Where the vLLM virtualenv's python is: the environment variable wins, else the repository's .venv-vllm; only
an executable file counts, and the reason for a miss names the place looked at and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.cloud_pool.vllm_env import ENV_VAR, REPO_ROOT, missing_reason, vllm_python


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_repository_root_is_the_checkout() -> None:
    assert (REPO_ROOT / "cloud_pool" / "vllm_env.py").is_file()


def test_the_repositorys_venv_is_used_when_nothing_is_configured(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert vllm_python(tmp_path) is None
    assert missing_reason(tmp_path) == (f"no vLLM virtualenv python at {tmp_path / '.venv-vllm/bin/python'}; "
                                        f"run scripts/setup-vllm.sh (or set {ENV_VAR})")
    py = executable(tmp_path / ".venv-vllm" / "bin" / "python")
    assert vllm_python(tmp_path) == py


def test_the_environment_variable_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    executable(tmp_path / ".venv-vllm" / "bin" / "python")
    elsewhere = executable(tmp_path / "opt" / "vllm" / "python3")
    monkeypatch.setenv(ENV_VAR, str(elsewhere))
    assert vllm_python(tmp_path) == elsewhere
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "gone"))
    assert vllm_python(tmp_path) is None  # no fallback to the repository's: what was configured is missing
    assert missing_reason(tmp_path).startswith(f"no vLLM virtualenv python at {ENV_VAR}={tmp_path / 'gone'};")


def test_a_file_that_cannot_be_run_does_not_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    executable(tmp_path / ".venv-vllm" / "bin" / "python").chmod(0o644)
    assert vllm_python(tmp_path) is None


def test_a_directory_does_not_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dir").mkdir()
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "dir"))
    assert vllm_python(tmp_path) is None
