"""Run real HTTP servers inside the test process, each on its own thread and event loop, on a free port."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from aiohttp import web

from tests.support.ports import free_port  # one helper for the benchmarks and the tests; re-exported here
from tests.support.waiting import wait_until

__all__ = ["ThreadedAiohttp", "ThreadedGateway", "aiohttp_server", "free_port", "gateway_server"]


@dataclass
class ThreadedAiohttp:
    app: web.Application
    port: int
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def aiohttp_server(app: web.Application, port: int | None = None) -> Iterator[ThreadedAiohttp]:
    """Serve an aiohttp app on 127.0.0.1 until the block ends."""
    port = port or free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    started = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        started.set()
        await stop.wait()
        await runner.cleanup()

    t = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    t.start()
    if not started.wait(10):
        raise RuntimeError("aiohttp test server did not start")
    try:
        yield ThreadedAiohttp(app, port, loop, t)
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(10)


@dataclass
class ThreadedGateway:
    server: uvicorn.Server
    port: int
    thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway(self):
        return self.server.config.app.state.gateway


@contextmanager
def gateway_server(settings, keyring=None, ready: bool = True) -> Iterator[ThreadedGateway]:
    """Serve a real gateway (uvicorn, same settings as production) on a free port until the block ends."""
    # start-up time: every pytest run loads this module (the tests.support.redis plugin imports free_port);
    # the whole gateway (~0.4 s) is imported only once a test starts one
    from tiergate.gateway.app import create_app

    port = free_port()
    settings = settings.model_copy(update={"port": port, "log_format": "console", "log_level": "warning"})
    app = create_app(settings, keyring=keyring)
    # As `tiergate serve` runs it: uvloop and httptools (the event loop and HTTP parser of production), the socket's
    # peer as the scope's client (no proxy-header rewriting).
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning",
                            lifespan="on", timeout_graceful_shutdown=5, proxy_headers=False)
    server = uvicorn.Server(config)
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    probe = "/readyz" if ready else "/healthz"
    wait_until(lambda: _ok(url + probe), timeout_s=30, what=f"gateway {probe}")
    try:
        yield ThreadedGateway(server, port, t)
    finally:
        server.should_exit = True
        t.join(15)


def _ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
