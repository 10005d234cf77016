"""Graceful shutdown: on SIGTERM, first say "not ready", then stop accepting, then let streams finish.

A load balancer (or Kubernetes endpoints controller) only stops sending traffic once it sees /readyz fail,
so the listener stays open for `drain_delay_s` while /readyz answers 503; then uvicorn stops accepting and
waits up to its graceful-shutdown timeout for in-flight requests, streams included. A second signal exits at once.
"""

from __future__ import annotations

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
