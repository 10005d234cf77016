"""Stands in for llama-server's `tools/server/tests/conftest.py` in the staged suite (copied as `conftest.py`).

Theirs downloads every preset's model from a hub before the run and stops every server after each test; here the
one model is the packaged SmolLM2 (nothing to download), a node is reused by the tests that configure it alike
(utils.py), and the tests tiergate does not run are skipped with their reason (adaptations.py, ADAPTATIONS.md).
"""

from __future__ import annotations

import os

import pytest
import utils  # the staged stand-in (stand_in_utils.py), beside this file

from tests.llama_server.adaptations import SLOW, skip_reason


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    target = os.environ.get("TIERGATE_LLAMA_TARGET", "edge")
    for item in items:
        reason = skip_reason(target, item.nodeid.split("/")[-1]) or (SLOW if item.get_closest_marker("slow") else None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session", autouse=True)
def stop_servers_at_the_end():
    """Nodes and gateways stop with the session, while the interpreter still runs their shutdown normally."""
    yield
    utils.stop_all()
