"""`core.serving.HeadTimeoutProtocol` and `core.http.read_body`'s deadline: a client that sends its request slowly,
or not at all, loses its connection (or gets a 408) instead of holding it for as long as it likes. A real uvicorn
server here, and a real `tiergate serve` (the settings reaching the protocol)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.support.servers import free_port
from tests.support.waiting import wait_until
from tiergate.core.errors import OpenAIError
from tiergate.core.http import error_response, read_body
from tiergate.core.serving import head_timeout_protocol


async def _echo(request: Request) -> Response:
    try:
        return JSONResponse({"bytes": len(await read_body(request, 1 << 20, timeout_s=1.0))})
    except OpenAIError as exc:
        return error_response(exc)


@contextmanager
def _server(header_timeout_s: float) -> Iterator[int]:
    port = free_port()
    config = uvicorn.Config(Starlette(routes=[Route("/", _echo, methods=["POST"])]), host="127.0.0.1", port=port,
                            http=head_timeout_protocol(header_timeout_s), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout_s=30, what="uvicorn started")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)


def _closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (b"" at once: closed without an answer)."""
    sock.settimeout(30)
    out = b""
    while chunk := sock.recv(4096):
        out += chunk
    return out


def test_a_connection_that_never_finishes_its_head_is_closed_and_a_prompt_one_is_served() -> None:
    with _server(header_timeout_s=0.5) as port:
        silent = socket.create_connection(("127.0.0.1", port))
        trickle = socket.create_connection(("127.0.0.1", port))
        trickle.sendall(b"POST / HTTP/1.1\r\nhost: x\r\n")  # and then nothing more
        assert _closed_by_server(silent) == b"" and _closed_by_server(trickle) == b""
        with socket.create_connection(("127.0.0.1", port)) as ok:  # a whole request, twice on one connection
            ok.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi" * 2)
            ok.settimeout(30)
            got = b""
            while got.count(b'{"bytes":2}') < 2:
                got += ok.recv(4096)


def test_a_body_that_does_not_arrive_in_time_is_a_408() -> None:
    with _server(header_timeout_s=30) as port, socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nhalf")
        sock.settimeout(30)
        head = sock.recv(4096)
    assert head.startswith(b"HTTP/1.1 408") and b"body_timeout" in head


def test_tiergate_serve_applies_its_header_timeout(tmp_path) -> None:
    port = free_port()
    env = os.environ | {"TIERGATE_PORT": str(port), "TIERGATE_HEADER_TIMEOUT_S": "0.5", "TIERGATE_EMBEDDER": "",
                        "TIERGATE_REDIS_URL": "", "TIERGATE_CACHE": "false", "TIERGATE_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([sys.executable, "-m", "tiergate.gateway.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def listening() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_until(listening, timeout_s=120, what="tiergate serve listening")
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert _closed_by_server(silent) == b""
    finally:
        proc.terminate()
        proc.wait(30)
