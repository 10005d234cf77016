"""Stopping a component's background task: cancel it and wait until it has finished.

Every long-lived component (cache sweepers and syncs, the embedder's batcher, pool health checks, edge
heartbeats) owns a loop task; its `stop()` must not return while that loop can still run a step, or a step
would touch a closed connection or outlive the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel `task` (if any) and wait for it to end. Its cancellation is swallowed; an error it had already
    ended with is raised here, as awaiting it would (callers that tolerate one say so)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
