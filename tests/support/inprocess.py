"""A gateway run inside the test's own thread and event loop (httpx's ASGI transport, lifespan run by hand), so
that a test can watch the request's whole path (a profiler hook sees only its own thread). A response's
background work (its settlement) has run when the call returns: the transport awaits the whole ASGI call."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

__all__ = ["in_process"]


@asynccontextmanager
async def in_process(settings: Settings, keyring: KeyRing) -> AsyncIterator[httpx.AsyncClient]:
    # start-up time: the whole gateway is imported only once a test starts one
    from tiergate.gateway.app import create_app

    app = create_app(settings.model_copy(update={"log_format": "console", "log_level": "warning"}), keyring=keyring)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), \
            httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as client:
        for _ in range(300):
            if (await client.get("/readyz")).status_code == 200:
                break
            await asyncio.sleep(0.02)
        yield client
