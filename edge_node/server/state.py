"""What the edge node's HTTP app needs besides the engine; `draining` flips on SIGTERM."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tiergate.edge_node.engine.engine import Engine

__all__ = ["ServerState"]


@dataclass(slots=True)
class ServerState:
    engine: Engine
    model_name: str
    max_body_bytes: int = 8 << 20
    draining: bool = False
    test_hooks: bool = False  # POST /_test/hold and /_test/release (TIERGATE_EDGE_TEST_HOOKS=1): tests only
    node_id: str | None = None
    lora_dir: Path | None = None  # adapters POST /admin/lora may swap in, by file name (None: swaps are off)
    api_keys: tuple[str, ...] = ()  # bearer keys every request but /health must carry (none: the API is open)
    started: int = field(default_factory=lambda: int(time.time()))
    on_startup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_shutdown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
