"""uvicorn's HTTP protocol (httptools) with a deadline for each request's head.

uvicorn bounds idle keep-alive connections but not a connection that sends its request line and headers slowly,
or nothing at all: a few hundred such connections hold as many file descriptors for as long as their clients
like, and past the process's descriptor limit every new client is refused. Here each connection must complete a
request's headers within `header_timeout_s` of opening (or of its previous response's end), or it is closed. The
body is bounded where it is read (`core.http.read_body`), the number of connections by uvicorn's
`limit_concurrency` (a 503 past it).

Tested in `tests/core/test_serving.py`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["DEFAULT_HEADER_TIMEOUT_S", "HeadTimeoutProtocol", "head_timeout_protocol"]

DEFAULT_HEADER_TIMEOUT_S = 10.0


class HeadTimeoutProtocol(HttpToolsProtocol):
    """An httptools protocol that closes a connection whose request head takes longer than `header_timeout_s`."""

    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


def head_timeout_protocol(header_timeout_s: float) -> type[HeadTimeoutProtocol]:
    """The protocol class for uvicorn's `http=`, its head deadline set for this process.

    One class, its deadline a class attribute, because uvicorn instantiates the class itself, and `--workers`
    processes import it by name: each worker sets the deadline again when it loads the app (`gateway.main`)."""
    HeadTimeoutProtocol.header_timeout_s = header_timeout_s
    return HeadTimeoutProtocol
