"""Graceful shutdown: on SIGTERM (or SIGINT), first say "not ready", then stop accepting, then let streams finish.

A load balancer (or Kubernetes endpoints controller) only stops sending traffic once it sees /readyz fail,
so the listener stays open for `drain_delay_s` while /readyz answers 503; then uvicorn stops accepting and
waits up to its graceful-shutdown timeout for in-flight requests, streams included. Shortly before that time
is up, whatever is still in flight is ended with an explicit error (`Dispatcher.abort_all`: a 503
`shutting_down`, or an SSE error event then `[DONE]` for a stream that has begun) rather than cut when uvicorn
gives up on it. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import structlog
import uvicorn

__all__ = ["DrainingServer"]

log = structlog.get_logger("tiergate.gateway")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, gateway, drain_delay_s: float) -> None:
        super().__init__(config)
        self._gateway = gateway
        self._drain_delay_s = drain_delay_s
        self._draining = False

    def handle_exit(self, sig: int, frame) -> None:  # type: ignore[override]
        if self._draining or self._drain_delay_s <= 0:
            self._gateway.draining = True
            return super().handle_exit(sig, frame)
        self._draining = True
        self._gateway.draining = True
        log.info("draining", signal=sig, delay_s=self._drain_delay_s,
                 graceful_shutdown_s=self.config.timeout_graceful_shutdown)
        timer = threading.Timer(self._drain_delay_s, super().handle_exit, (sig, frame))
        timer.daemon = True
        timer.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        graceful = self.config.timeout_graceful_shutdown
        abort = None
        if graceful is not None:  # end what is left explicitly a little before uvicorn cancels it
            abort = asyncio.get_running_loop().call_later(graceful - min(2.0, graceful / 2), self._abort, graceful)
        try:
            await super().shutdown(sockets)
        finally:
            if abort is not None:
                abort.cancel()

    def _abort(self, graceful: float) -> None:
        n = self._gateway.dispatcher.abort_all(f"its graceful shutdown time of {graceful:g}s is almost over")
        if n:
            log.warning("shutdown_ending_requests", requests=n, graceful_shutdown_s=graceful)
