"""core/shutdown: at the drain deadline the server ends what is in flight itself, and uvicorn waits `flush_s` more
for those explicit ends to reach the clients before it cancels anything.

A real uvicorn server on a free port, on its own thread; a real HTTP client streams from it while it shuts down.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn

from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tiergate.core.shutdown import FLUSH_S, DeadlineServer

END = b"data: {\"error\": {\"code\": \"shutting_down\"}}\n\ndata: [DONE]\n\n"


class StreamingApp:
    """Streams one chunk, then holds the response open until `end_in_flight` ends it (unless it `ignores` it)."""

    def __init__(self, ignores: bool = False) -> None:
        self.ignores = ignores
        self.ended_at: list[float] = []  # the deadlines end_in_flight was called with
        self.cancelled = threading.Event()
        self._ends: list[asyncio.Event] = []

    def end_in_flight(self, deadline_s: float) -> None:
        self.ended_at.append(deadline_s)
        for e in self._ends:
            e.set()

    async def __call__(self, scope: dict, receive: object, send) -> None:  # type: ignore[no-untyped-def]
        assert scope["type"] == "http"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {\"n\": 1}\n\n", "more_body": True})
        end = asyncio.Event()
        self._ends.append(end)
        try:
            await (asyncio.Event() if self.ignores else end).wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await send({"type": "http.response.body", "body": END, "more_body": False})


@contextmanager
def serving(app: StreamingApp, deadline_s: float, flush_s: float) -> Iterator[tuple[DeadlineServer, str]]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="off", log_level="critical")
    server = DeadlineServer(config, deadline_s, app.end_in_flight, flush_s=flush_s)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="uvicorn started")
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


def _stream_while_shutting_down(server: DeadlineServer, url: str) -> tuple[bytes, Exception | None]:
    """Read a stream; once its first event is in, begin the graceful shutdown. What arrived, and how it broke."""
    got = b""
    try:
        with httpx.stream("GET", url + "/v1/chat/completions", timeout=30) as r:
            for chunk in r.iter_bytes():
                got += chunk
                server.should_exit = True
    except httpx.HTTPError as exc:
        return got, exc
    return got, None


def test_in_flight_requests_are_ended_explicitly_at_the_deadline_and_the_end_reaches_the_client() -> None:
    app = StreamingApp()
    with serving(app, deadline_s=0.2, flush_s=5.0) as (server, url):
        got, broken = _stream_while_shutting_down(server, url)
    assert broken is None
    assert got == b"data: {\"n\": 1}\n\n" + END  # the whole stream, its explicit end included
    assert app.ended_at == [0.2]
    assert not app.cancelled.is_set()


def test_what_ignores_the_explicit_end_is_cancelled_flush_s_later() -> None:
    app = StreamingApp(ignores=True)
    with serving(app, deadline_s=0.1, flush_s=0.3) as (server, url):
        got, broken = _stream_while_shutting_down(server, url)
        wait_until(app.cancelled.is_set, what="uvicorn cancelled the request")
    assert app.ended_at == [0.1]  # it was asked to end first
    assert isinstance(broken, httpx.RemoteProtocolError)  # then cut mid-body
    assert got == b"data: {\"n\": 1}\n\n"


def test_a_server_with_nothing_in_flight_stops_without_waiting_for_the_deadline() -> None:
    app = StreamingApp()
    with serving(app, deadline_s=600, flush_s=600) as (server, _url):
        server.should_exit = True
    assert app.ended_at == []  # `serving` joined the thread well before 600 s, and nothing needed ending


def test_uvicorns_own_timeout_is_the_deadline_plus_the_flush_time() -> None:
    def make(**kw: float) -> DeadlineServer:
        return DeadlineServer(uvicorn.Config(StreamingApp()), end_in_flight=print, **kw)  # type: ignore[arg-type]

    assert make(deadline_s=30).config.timeout_graceful_shutdown == pytest.approx(30 + FLUSH_S)
    assert make(deadline_s=2, flush_s=0.5).config.timeout_graceful_shutdown == pytest.approx(2.5)
