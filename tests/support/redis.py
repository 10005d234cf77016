"""A real redis-server (Debian's, stock 7.0, no modules) for tests: own port, own temp dir, no persistence.

`redis_server` (session) can be stopped and started again on the same port, so tests can kill Redis in
the middle of traffic; `redis_url` (function) makes sure it runs and flushes it for each test.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import free_port
from tests.support.tools import require_tool

__all__ = ["RedisServer", "redis_server", "redis_url"]


class RedisServer:
    def __init__(self, binary: str, workdir: Path, port: int) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(self.workdir), "--logfile", str(self.workdir / "redis.log"), "--daemonize", "no",
               "--enable-debug-command", "local"]  # DEBUG SLEEP: tests simulate a hung Redis
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}; see "
                                   f"{self.workdir / 'redis.log'}")
            if self._ping():
                return
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server did not answer PING within 15 s")

    def stop(self) -> None:
        """Kill it (SIGKILL: like a crash; nothing is saved anyway)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def _ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = require_tool("redis-server", "apt-get install -y redis-server")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    import redis

    redis_server.start()  # a previous test may have left it stopped
    client = redis.Redis.from_url(redis_server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url
