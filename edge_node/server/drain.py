"""`edge-node serve`'s server: uvicorn with a drain on SIGTERM/SIGINT.

On the first signal the node deregisters, refuses new work and lets what it holds finish. At the drain deadline
whatever is still running or queued is ended by stopping the engine, which ends each request with an explicit
error (an SSE error event then `[DONE]`, or an OpenAI error object); `core.shutdown` gives those ends time to
reach the clients before uvicorn would cancel anything. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import structlog
import uvicorn

from tiergate.core.shutdown import DeadlineServer
from tiergate.edge_node.server.state import ServerState

__all__ = ["DrainingServer"]

log = structlog.get_logger("edge_node.drain")


class _Deregisters(Protocol):
    async def deregister(self) -> bool: ...


class DrainingServer:
    """Runs the node's app; `engine_failed` (from the engine thread) deregisters and exits."""

    def __init__(self, app: Any, host: str, port: int, drain_timeout: float, state: ServerState | None,
                 registrar: _Deregisters | None, log_level: str, *, ssl_certfile: str | None = None,
                 ssl_keyfile: str | None = None) -> None:
        # HTTPS when given a certificate and its key (uvicorn's own TLS); proxy headers never rewrite the peer
        config = uvicorn.Config(app, host=host, port=port, log_level="warning" if log_level == "info" else log_level,
                                access_log=False, lifespan="on", ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile,
                                proxy_headers=False)
        outer = self

        class _Server(DeadlineServer):
            def handle_exit(self, sig: int, frame: object) -> None:
                outer._on_signal(sig)

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
                try:
                    yield
                finally:
                    for s, h in old.items():
                        signal.signal(s, h)

            async def startup(self, sockets: Any = None) -> None:
                outer._loop = asyncio.get_running_loop()
                await super().startup(sockets)

        self.server = _Server(config, drain_timeout, self._end_in_flight)
        self.state = state
        self.registrar = registrar
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signals = 0

    @property
    def startup_failed(self) -> bool:
        return not self.server.started

    def run(self) -> None:
        with contextlib.suppress(SystemExit):
            self.server.run()

    def engine_failed(self, why: str) -> None:
        """From the engine thread: the decode loop died. Deregister and exit (the CLI then exits non-zero)."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(lambda: loop.create_task(self._leave()))

    async def _leave(self) -> None:
        if self.registrar is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.registrar.deregister(), 5)
        self.server.should_exit = True

    def _on_signal(self, sig: int) -> None:
        self._signals += 1
        loop = self._loop
        if self._signals > 1 or loop is None:
            self.server.should_exit = True
            if self._signals > 1:
                self.server.force_exit = True
            return
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain(sig)))

    def _end_in_flight(self, deadline_s: float) -> None:
        """The drain deadline: stop the engine, which ends every request it holds with an explicit error."""
        engine = self.state.engine if self.state is not None else None
        if engine is not None and engine.in_flight():
            log.warning("drain timeout: ending requests still in flight", in_flight=engine.in_flight(),
                        drain_timeout_s=deadline_s)
            threading.Thread(target=engine.stop, name="edge-engine-stop", daemon=True).start()

    async def _drain(self, sig: int) -> None:
        if self.state is not None:
            self.state.draining = True
            self.state.engine.stop_accepting()
            log.info("draining", signal=signal.Signals(sig).name, in_flight=self.state.engine.in_flight())
        await self._leave()
