"""Noticing a client that hangs up before its answer has begun (see `CompletionPipeline._dispatch_while_connected`).

Tested in `tests/gateway/test_app_limits.py`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from starlette.types import Message

__all__ = ["DisconnectWatch"]


class DisconnectWatch:
    """Cancels a request's handler task if its client disconnects; `fired` says it did.

    The watching task starts only once the request has taken `after_s`: most answers that come that fast
    are over before a disconnect could matter, and a timer costs a fraction of a task (the gateway's whole
    budget is under a millisecond per request). It reads the ASGI channel, whose next message after the
    body is the disconnect (or the end of the response, by which time the watch is closed).
    """

    __slots__ = ("_receive", "_task", "_timer", "_watcher", "fired")

    def __init__(self, receive: Callable[[], Awaitable[Message]], task: asyncio.Task[object],
                 after_s: float = 0.05) -> None:
        self._receive, self._task = receive, task
        self._watcher: asyncio.Task[None] | None = None
        self.fired = False
        self._timer = asyncio.get_running_loop().call_later(after_s, self._start)

    def _start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        for _ in range(8):  # a server that sends more (empty) body messages is not waited on for ever
            if (await self._receive())["type"] == "http.disconnect":
                self.fired = True
                self._task.cancel()
                return

    def close(self) -> None:
        self._timer.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
