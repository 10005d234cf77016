"""The live policy of a gateway process, hot-reloaded, always the last good one.

Reloads come from a file watch (the file's directory is watched, so editors that write-and-rename and a
Kubernetes ConfigMap's `..data` symlink swap are both seen), from SIGHUP and from the admin endpoint
(`await store.reload()`). A new file that fails validation is rejected, logged and counted while the
previous policy keeps serving. The version is a hash of the file's bytes, so every worker and replica
watching the same file converges on the same version string without talking to each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import structlog
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Info

from tiergate.core.filewatch import poll_file, watch_file
from tiergate.policies.engine import PolicyEngine
from tiergate.policies.loader import PolicyError, Problem, parse_policy
from tiergate.policies.model import Policy

__all__ = ["ActivePolicy", "PolicyMetrics", "PolicyStore", "ReloadResult", "policy_version"]

log = structlog.get_logger("tiergate.policy")


class PolicyMetrics:
    """The policy's Prometheus metrics (prefix `tiergate_policy_`), one set per registry."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        p = "tiergate_policy_"
        self.reloads = Counter(p + "reloads", "Policy reload attempts by result: ok, invalid, unchanged, "
                                              "unreadable", ["result"], registry=registry)
        self.active = Info(p.rstrip("_"), "The active policy: version (hash of the file) and source file",
                           registry=registry)
        self.loaded_at = Gauge(p + "loaded_timestamp_seconds", "When the active policy was loaded",
                               registry=registry)
        self.last_reload = Gauge(p + "last_reload_timestamp_seconds", "When a reload was last attempted",
                                 registry=registry)
        self.last_reload_ok = Gauge(p + "last_reload_success", "1 if the last reload attempt succeeded, else 0",
                                    registry=registry)
        self.rules = Gauge(p + "rules", "Rules in the active policy (default_tier counted as one)",
                           registry=registry)


@cache
def default_metrics() -> PolicyMetrics:
    """The metrics on the default registry, created once per process on first use."""
    return PolicyMetrics(REGISTRY)


@dataclass(frozen=True, slots=True)
class ActivePolicy:
    """One loaded policy version; swapped as a whole, so readers never see half a reload."""

    policy: Policy
    engine: PolicyEngine
    version: str
    loaded_at: float
    source: Path


@dataclass(frozen=True, slots=True)
class ReloadResult:
    ok: bool
    changed: bool
    version: str  # the version serving after the attempt (the old one when rejected)
    error: str | None = None


def policy_version(data: bytes) -> str:
    """Same bytes, same version, in every process."""
    return hashlib.sha256(data).hexdigest()[:12]


class PolicyStore:
    """Holds the active policy for `path`. An invalid file at construction raises PolicyError (fatal)."""

    def __init__(self, path: str | Path, *, metrics: PolicyMetrics | None = None,
                 poll_interval_s: float | None = None) -> None:
        self.path = Path(path)
        self._metrics = metrics or default_metrics()
        self._poll_interval_s = poll_interval_s
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            raise _unreadable(self.path, exc) from None
        self._current = self._load(data)
        self._publish(self._current)
        self._callbacks: list[Callable[[ActivePolicy], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task[object]] = []
        self._lock: asyncio.Lock | None = None
        self.last_error: str | None = None
        self.last_attempt: float = self._current.loaded_at

    def _load(self, data: bytes) -> ActivePolicy:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _unreadable(self.path, exc) from None
        policy = parse_policy(text, str(self.path), self.path.resolve().parent)
        return ActivePolicy(policy, PolicyEngine(policy), policy_version(data), time.time(), self.path)

    def _publish(self, active: ActivePolicy) -> None:
        m = self._metrics
        m.active.info({"version": active.version, "source": str(active.source)})
        m.loaded_at.set(active.loaded_at)
        m.rules.set(len(active.engine.rule_names))

    @property
    def current(self) -> ActivePolicy:
        """The policy serving right now (safe to read from any thread)."""
        return self._current

    def on_change(self, callback: Callable[[ActivePolicy], Awaitable[None]]) -> None:
        """Call `await callback(new_active_policy)` after every successful change."""
        self._callbacks.append(callback)

    async def reload(self) -> ReloadResult:
        """Re-read the file: adopt it when valid and different, else keep serving the current policy."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            return await self._reload()

    async def _reload(self) -> ReloadResult:
        now = time.time()
        self.last_attempt = now
        self._metrics.last_reload.set(now)
        try:
            data = await asyncio.to_thread(self.path.read_bytes)
        except OSError as exc:
            return self._reject(str(_unreadable(self.path, exc)), "unreadable")
        version = policy_version(data)
        if version == self._current.version:
            self._metrics.reloads.labels("unchanged").inc()
            self._metrics.last_reload_ok.set(1)
            self.last_error = None
            return ReloadResult(True, False, version)
        try:
            new = await asyncio.to_thread(self._load, data)
        except PolicyError as exc:
            return self._reject(str(exc), "invalid")
        old, self._current = self._current, new
        self.last_error = None
        self._publish(new)
        self._metrics.reloads.labels("ok").inc()
        self._metrics.last_reload_ok.set(1)
        log.info("policy_reloaded", version=new.version, previous=old.version, source=str(self.path),
                 warnings=list(new.policy.warnings) or None)
        for cb in self._callbacks:
            try:
                await cb(new)
            except Exception:
                log.exception("policy_change_callback_failed", version=new.version)
        return ReloadResult(True, True, new.version)

    def _reject(self, error: str, result: str) -> ReloadResult:
        self._metrics.reloads.labels(result).inc()
        self._metrics.last_reload_ok.set(0)
        self.last_error = error
        log.error("policy_rejected", error=error, keeping=self._current.version, source=str(self.path))
        return ReloadResult(False, False, self._current.version, error)

    def install_sighup(self, loop: asyncio.AbstractEventLoop | None = None) -> bool:
        """Reload on SIGHUP (main thread, Unix). Returns False where signals cannot be installed."""
        loop = loop or asyncio.get_running_loop()
        try:
            loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload()))
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            return False
        return True

    def _spawn(self, coro: Awaitable[object]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.append(task)  # keep a reference until done
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def start(self) -> None:
        """Start watching the file (and polling, when asked) for changes."""
        if not any(t.get_name() == "policy-watch" for t in self._tasks):
            loop = asyncio.get_running_loop()
            self._tasks.append(loop.create_task(self._watch(), name="policy-watch"))
            if self._poll_interval_s:
                self._tasks.append(loop.create_task(self._poll(self._poll_interval_s), name="policy-poll"))

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _watch(self) -> None:
        await watch_file(self.path, self.reload, what="policy")

    async def _poll(self, interval: float) -> None:
        """A safety net for filesystems that deliver no change events (some network and overlay mounts)."""
        await poll_file(self.reload, interval, what="policy")


def _unreadable(path: Path, exc: Exception) -> PolicyError:
    reason = getattr(exc, "strerror", None) or str(exc)
    return PolicyError(str(path), [Problem(str(path), None, None, "", f"cannot read the policy file: {reason}")])
