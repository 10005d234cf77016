"""Graceful shutdown: on SIGTERM (or SIGINT), first say "not ready", then stop accepting, then let streams finish.

A load balancer (or Kubernetes endpoints controller) only stops sending traffic once it sees /readyz fail,
so the listener stays open for `drain_delay_s` while /readyz answers 503; then uvicorn stops accepting and
waits for in-flight requests, streams included. When the graceful-shutdown time is up, whatever is still in
flight is ended with an explicit error (`Dispatcher.abort_all`: a 503 `shutting_down`, or an SSE error event
then `[DONE]` for a stream that has begun), and `core.shutdown` gives those ends time to reach the clients
before uvicorn would cut anything. A second signal skips what is left of the delay.
"""

from __future__ import annotations

import threading
from types import FrameType
from typing import Protocol

import structlog
import uvicorn

from tiergate.core.shutdown import DeadlineServer

__all__ = ["DrainingServer"]

log = structlog.get_logger("tiergate.gateway")


class Drains(Protocol):
    """What the server tells to drain on the first signal (the gateway: its /readyz then answers 503)."""

    draining: bool
    dispatcher: Aborts


class Aborts(Protocol):
    def abort_all(self, reason: str) -> int: ...


class DrainingServer(DeadlineServer):
    def __init__(self, config: uvicorn.Config, gateway: Drains, drain_delay_s: float, graceful_shutdown_s: float) -> None:
        super().__init__(config, graceful_shutdown_s, self._abort)
        self._gateway = gateway
        self._drain_delay_s = drain_delay_s
        self._draining = False
        self._timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self._gateway.draining = True
        if self._timer is not None:  # a second signal: stop accepting now, once
            self._timer.cancel()
        if self._draining or self._drain_delay_s <= 0:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        log.info("draining", signal=sig, delay_s=self._drain_delay_s, graceful_shutdown_s=self.deadline_s)
        self._timer = threading.Timer(self._drain_delay_s, super().handle_exit, (sig, frame))
        self._timer.daemon = True
        self._timer.start()

    def _abort(self, graceful: float) -> None:
        n = self._gateway.dispatcher.abort_all(f"its graceful shutdown time of {graceful:g}s is over")
        if n:
            log.warning("shutdown_ending_requests", requests=n, graceful_shutdown_s=graceful)
