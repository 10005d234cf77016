"""`gateway.main`: the ASGI entry point uvicorn workers import builds one gateway app from TIERGATE_* settings."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from starlette.applications import Starlette

from tests.gateway.conftest import write_policy

DEAD = "http://127.0.0.1:9"


def test_importing_it_builds_the_app_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = write_policy(tmp_path / "p.yaml", [DEAD], [DEAD])
    for name, value in {"TIERGATE_POLICY": str(policy), "TIERGATE_REDIS_URL": "", "TIERGATE_EMBEDDER": "",
                        "TIERGATE_API_KEYS": "env-key-1=alpha", "TIERGATE_LOG_FORMAT": "console"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delitem(sys.modules, "tiergate.gateway.main", raising=False)
    main = importlib.import_module("tiergate.gateway.main")
    monkeypatch.delitem(sys.modules, "tiergate.gateway.main")  # the next import builds its own
    gw = main.app.state.gateway
    assert isinstance(main.app, Starlette) and gw.settings.policy == policy
    assert gw.keys.authenticate("Bearer env-key-1").id == "alpha"
