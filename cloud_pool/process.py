"""Run one vLLM server as a child process: start, wait for /health, stop cleanly or kill.

vLLM forks an engine core and workers; the server is started in its own process group so
that stopping it (SIGTERM to the API server, which shuts its engine down in a few seconds;
then SIGKILL to the group if anything lingers) and crashing it on purpose (SIGKILL to the
group) never leave orphans. Its IPC sockets and compile cache go to a private work directory
instead of /tmp and ~/.cache.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tiergate.cloud_pool.render import vllm_argv, vllm_env
from tiergate.cloud_pool.spec import UnauthenticatedBind, VllmSpec

__all__ = ["UnauthenticatedBind", "VllmProcess", "VllmStartError", "free_port"]


class VllmStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET
        return port


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class VllmProcess:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str], base_url: str, log_path: Path) -> None:
        self.argv = list(argv)
        self.base_url = base_url
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            self.argv, env=dict(env), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.started_at = time.monotonic()

    @classmethod
    def from_spec(
        cls,
        spec: VllmSpec,
        workdir: Path,
        *,
        python: str | None = None,
        model: str | None = None,
        host: str | None = None,
        port: int | None = None,
        extra_env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
    ) -> VllmProcess:
        """Start the server a spec describes, with its caches and sockets under `workdir`."""
        host = host or spec.host
        port = port or spec.port
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "rpc").mkdir(exist_ok=True)
        env = dict(os.environ) | vllm_env(spec) | {
            "VLLM_CACHE_ROOT": str(workdir / "cache"),
            "VLLM_RPC_BASE_PATH": str(workdir / "rpc"),
            "PYTHONUNBUFFERED": "1",
        } | dict(extra_env or {})
        if not _loopback(host) and not env.get("VLLM_API_KEY"):
            raise UnauthenticatedBind(
                f"refusing to start vLLM on {host or 'every address'}:{port} without VLLM_API_KEY: anyone who can "
                f"reach it would skip the gateway's keys and limits. Set VLLM_API_KEY (and the tier's api_key_env "
                f"on the gateway), or bind to 127.0.0.1.")
        argv = vllm_argv(spec, python=python, model=model, host=host, port=port)
        connect_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        return cls(argv, env, f"http://{connect_host}:{port}", log_path or workdir / "server.log")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout_s) as resp:
                status: int = resp.status  # an http.client.HTTPResponse (typeshed: Any)
                return status == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait_healthy(self, timeout_s: float = 300.0, on_progress: Callable[[float, str], None] | None = None) -> float:
        """Block until /health answers 200; returns the seconds it took. Raises VllmStartError."""
        deadline = self.started_at + timeout_s
        while True:
            elapsed = time.monotonic() - self.started_at
            if self.healthy():
                return elapsed
            if not self.alive():
                raise VllmStartError(
                    f"vLLM exited with code {self.proc.returncode} after {elapsed:.0f}s; log {self.log_path}:\n"
                    f"{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise VllmStartError(
                    f"vLLM not healthy after {timeout_s:.0f}s at {self.base_url}; log {self.log_path}:\n{self.log_tail()}"
                )
            if on_progress is not None:
                on_progress(elapsed, self.log_tail(1))
            time.sleep(1.0)

    def pids(self) -> list[int]:
        """The server and every process in its group (API server, engine core, workers)."""
        try:
            import psutil  # optional dependency: the edge and dev extras
        except ImportError:
            return [self.pid]
        try:
            root = psutil.Process(self.pid)
            return [root.pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []

    def terminate(self, grace_s: float = 20.0) -> int | None:
        """SIGTERM the API server (it stops its engine), SIGKILL the group if it outlives `grace_s`."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace_s)
        self._kill_group()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """Crash it: SIGKILL every process of the server at once (no graceful shutdown)."""
        self._kill_group()
        self._log.close()

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        deadline = time.monotonic() + 10  # SIGKILL is asynchronous: wait until the group has died
        while self._group_members() and time.monotonic() < deadline:
            time.sleep(0.05)

    def _group_members(self) -> list[int]:
        """Live (non-zombie) processes still in the server's process group."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.pid and fields[0] != "Z":
                members.append(int(entry.name))
        return members
