"""Shared fixtures: real servers for integration tests live in tests/support/ and are registered here."""

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.support.redis", "tests.support.edge", "tests.support.vllm", "tests.support.embedder"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# litellm (a client the tests drive) fetches its model price list from the network on import unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# Subprocesses the tests start (`python -m tiergate.edge_node`, the console scripts) import this checkout's
# tiergate/ links, whatever their working directory, rather than wherever the editable install points.
ROOT = str(Path(__file__).resolve().parents[1])
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


@pytest.fixture
def anyio_backend():
    return "asyncio"
