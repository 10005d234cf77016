"""`tiergate serve`: options and TIERGATE_* settings reach uvicorn (uvicorn itself is not started here)."""

from __future__ import annotations

import pytest
import uvicorn
from typer.testing import CliRunner

from tiergate.gateway.cli import app


@pytest.fixture
def captured(monkeypatch) -> dict:
    seen: dict = {}
    monkeypatch.setattr(uvicorn, "run", lambda target, **kw: seen.update(target=target, **kw))
    # `serve` writes its options into os.environ: set-then-delete makes monkeypatch restore each one
    # (as unset) afterwards, so nothing leaks into later tests that start gateways.
    for name in ("HOST", "PORT", "POLICY", "REDIS_URL", "EMBEDDER", "WORKERS"):
        monkeypatch.setenv(f"TIERGATE_{name}", "")
        monkeypatch.delenv(f"TIERGATE_{name}")
    return seen


def test_workers_come_from_the_environment(captured, monkeypatch):
    monkeypatch.setenv("TIERGATE_WORKERS", "3")
    result = CliRunner().invoke(app, ["serve", "--port", "18099"])
    assert result.exit_code == 0, result.output
    assert captured["workers"] == 3 and captured["port"] == 18099 and captured["target"] == "tiergate.gateway.main:app"


def test_the_workers_option_overrides_the_environment(captured, monkeypatch):
    monkeypatch.setenv("TIERGATE_WORKERS", "3")
    result = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert captured["workers"] == 2


def test_a_broken_policy_stops_serve_with_the_error(captured, tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\ntiers: {}\nrules: [\n")
    result = CliRunner().invoke(app, ["serve", "--policy", str(bad), "--workers", "2"])
    assert result.exit_code == 2
    assert str(bad) in result.output and captured == {}


def test_a_verifier_that_cannot_be_loaded_stops_serve_with_the_file_and_what_to_do(captured, tmp_path, monkeypatch):
    monkeypatch.setenv("TIERGATE_CACHE_VERIFIER", str(tmp_path / "verifier"))
    result = CliRunner().invoke(app, ["serve", "--workers", "2"])
    assert result.exit_code == 2 and captured == {}
    assert f"TIERGATE_CACHE_VERIFIER: {tmp_path / 'verifier' / 'verifier.json'} is missing" in result.output
    assert "tiergate cache train-verifier" in result.output
    monkeypatch.setenv("TIERGATE_CACHE", "false")  # no cache, nothing to verify: it starts
    assert CliRunner().invoke(app, ["serve", "--workers", "2"]).exit_code == 0
