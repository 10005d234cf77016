"""Shared fixtures: real servers for integration tests live in tests/support/ and are registered here."""

import os

import pytest

pytest_plugins = ["tests.support.redis", "tests.support.edge", "tests.support.vllm", "tests.support.embedder"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def anyio_backend():
    return "asyncio"
