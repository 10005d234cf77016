"""Watching a configuration file for changes, as operators change them: edited in place, written and renamed by an
editor, or swapped by a Kubernetes ConfigMap (its `..data` symlink). The file's directory is watched (and, for a
symlink, its target's), and a poll is the safety net for filesystems that deliver no change events.

Used by the policy (`policies.store`) and the tenants' key file (`gateway.keys`).
Tested in `tests/policies/test_store.py`, `tests/gateway/test_keys.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import structlog

__all__ = ["poll_file", "watch_file"]

log = structlog.get_logger("tiergate.config")


async def watch_file(path: Path, on_change: Callable[[], Awaitable[object]], *, what: str) -> None:
    """Await `on_change()` whenever `path` may have changed, until cancelled; a failing watch retries in 2 s."""
    from watchfiles import awatch  # start-up time: only a process that watches a file needs it

    # The path as given may be a symlink (ConfigMap): watch both the link's and the target's directory.
    watched = {path.resolve().parent, path.absolute().parent}
    while True:
        try:
            async for changes in awatch(*watched, debounce=200, step=50, recursive=False):
                names = {Path(p).name for _, p in changes}
                if path.name in names or path.resolve().name in names or any(n.startswith("..") for n in names):
                    await on_change()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("file_watch_failed", what=what, path=str(path), retry_in_s=2)
            await asyncio.sleep(2)


async def poll_file(on_change: Callable[[], Awaitable[object]], interval_s: float, *, what: str) -> None:
    """Await `on_change()` every `interval_s`, until cancelled (it must tell an unchanged file itself)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await on_change()
        except Exception:
            log.exception("file_poll_failed", what=what)
