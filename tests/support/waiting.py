"""Tests wait on a condition, never on a fixed sleep: these poll one until it holds or fail with what was awaited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

__all__ = ["eventually", "wait_until"]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, interval_s: float = 0.05,
               what: str = "condition") -> None:
    """From a test's own thread: poll `predicate` every `interval_s` until it holds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def eventually(predicate: Callable[[], bool | Awaitable[bool]], what: str, timeout_s: float = 20.0,
                     interval_s: float = 0.01) -> None:
    """From a test's event loop: poll `predicate` (plain or awaitable), letting other tasks run in between."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        await asyncio.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
