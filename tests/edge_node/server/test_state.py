"""What the edge node's app keeps besides the engine: defaults a node starts with, and hook lists of its own."""

from __future__ import annotations

import time

import pytest

from tiergate.edge_node.server.state import ServerState

ENGINE = object()  # the state only carries it


def test_a_new_node_serves_with_an_8_mib_body_limit_and_no_test_hooks() -> None:
    before = int(time.time())
    s = ServerState(ENGINE, "tiny")  # type: ignore[arg-type]
    assert s.engine is ENGINE and s.model_name == "tiny"
    assert s.max_body_bytes == 8 * 1024 * 1024
    assert s.draining is False and s.test_hooks is False and s.node_id is None
    assert before <= s.started <= int(time.time())
    assert s.on_startup == [] and s.on_shutdown == []


def test_each_node_has_its_own_hook_lists() -> None:
    a, b = ServerState(ENGINE, "a"), ServerState(ENGINE, "b")  # type: ignore[arg-type]

    async def hook() -> None: ...

    a.on_startup.append(hook)
    a.on_shutdown.append(hook)
    assert b.on_startup == [] and b.on_shutdown == []


def test_draining_flips_and_unknown_fields_are_refused() -> None:
    s = ServerState(ENGINE, "tiny")  # type: ignore[arg-type]
    s.draining = True
    assert s.draining
    with pytest.raises(AttributeError):
        s.drainig = True  # type: ignore[attr-defined]  # a typo must not silently add a field
