"""Shared fixtures: real servers for integration tests live in tests/support/ and are registered here."""

import os
from pathlib import Path

import pytest

pytest_plugins = []
for _mod in ("redis", "edge", "vllm", "embedder"):
    if (Path(__file__).parent / "support" / f"{_mod}.py").exists():
        pytest_plugins.append(f"tests.support.{_mod}")

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def anyio_backend():
    return "asyncio"
