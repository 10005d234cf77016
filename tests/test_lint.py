"""The project's lint rules (pyproject.toml [tool.ruff.lint]) hold on every Python file, and the status page's
script parses as JavaScript."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    ruff = Path(sys.executable).parent / "ruff"
    run = subprocess.run([str(ruff), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_status_page_script_is_valid_javascript() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.fail("node is needed to check gateway/static/status.js (apt-get install nodejs)")
    run = subprocess.run([node, "--check", str(ROOT / "gateway" / "static" / "status.js")], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
