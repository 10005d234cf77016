"""core/paths: where tiergate keeps what it builds locally, `$TIERGATE_HOME`, else `.tiergate/` in the source tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.core.paths import tiergate_home

ROOT = Path(__file__).resolve().parents[2]


def test_tiergate_home_is_the_environment_variable_when_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "home"))
    assert tiergate_home() == tmp_path / "home"


def test_without_the_variable_it_is_dot_tiergate_in_the_source_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """The checkout itself (through the tiergate/ links), not the working directory."""
    monkeypatch.delenv("TIERGATE_HOME", raising=False)
    monkeypatch.chdir("/")
    assert tiergate_home() == ROOT / ".tiergate"


def test_an_empty_variable_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_HOME", "")
    assert tiergate_home() == ROOT / ".tiergate"


def test_it_is_read_at_each_call_not_once_at_import(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "a"))
    first = tiergate_home()
    monkeypatch.setenv("TIERGATE_HOME", str(tmp_path / "b"))
    assert (first, tiergate_home()) == (tmp_path / "a", tmp_path / "b")
