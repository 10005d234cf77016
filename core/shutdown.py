"""A uvicorn server whose graceful shutdown ends what is still in flight explicitly, at the drain deadline.

uvicorn waits `timeout_graceful_shutdown` for in-flight requests and then cancels their tasks, which cuts a
stream mid-body. A server that wants to end them with an explicit error (an SSE error event then `[DONE]`, or
an OpenAI error object) must do it while uvicorn is still waiting, and the errors need time to reach the
clients. So the deadline is the server's own: at `deadline_s` after shutdown begins it calls `end_in_flight`,
and uvicorn's own timeout is set `flush_s` later, the time those explicit ends get to be written. uvicorn only
cancels what ignored its explicit end for that long.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import uvicorn

__all__ = ["FLUSH_S", "DeadlineServer"]

FLUSH_S = 5.0
"""How long explicit ends get to reach the clients before uvicorn cancels what is left."""


class DeadlineServer(uvicorn.Server):
    """`uvicorn.Server` that calls `end_in_flight(deadline_s)` at its drain deadline, before uvicorn gives up."""

    def __init__(self, config: uvicorn.Config, deadline_s: float, end_in_flight: Callable[[float], object],
                 flush_s: float = FLUSH_S) -> None:
        config.timeout_graceful_shutdown = deadline_s + flush_s  # type: ignore[assignment]  # a float works
        super().__init__(config)
        self.deadline_s = deadline_s
        self._end_in_flight = end_in_flight

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        end = asyncio.get_running_loop().call_later(self.deadline_s, self._end_in_flight, self.deadline_s)
        try:
            await super().shutdown(sockets)
        finally:
            end.cancel()
