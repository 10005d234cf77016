"""Keeps a cloud tier's servers current: who they are, whether each is up, and how busy.

A background task polls every server's `/health`, `/metrics` and (now and then) `/v1/models`
with bounded timeouts over one pooled aiohttp session, and re-resolves the discovery DNS name
(a Kubernetes headless Service resolves to one address per ready pod). A refused connection, an
error status or a wrong model marks a server unhealthy at once; a poll that merely times out counts
only after `slow_polls_unhealthy` in a row, because a vLLM server saturated by traffic answers
/metrics late and must not flap out of the pool. Tested in `tests/gateway/pools/test_cloud.py`.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
import structlog

from tiergate.core.pool import Endpoint, context_mismatch
from tiergate.core.tasks import cancel_and_wait
from tiergate.gateway.pools.backend_dns import GuardedResolver
from tiergate.gateway.pools.breaker import CircuitBreaker
from tiergate.gateway.pools.cloud_settings import CloudPoolSettings
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.pools.prefix_memory import PrefixMemory
from tiergate.gateway.pools.probe import Unhealthy, probe
from tiergate.gateway.pools.vllm_metrics import Rates, VllmMetrics, Window

__all__ = ["CloudPoller", "CloudServer", "Resolver"]

log = structlog.get_logger("tiergate.cloud_pool")

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a DNS name to IP addresses (injectable for tests)."""


@dataclass(slots=True)
class CloudServer:
    """One vLLM server as the last polls saw it, with the circuit breaker dispatch feeds."""

    endpoint: Endpoint
    static: bool
    breaker: CircuitBreaker
    window: Window
    healthy: bool | None = None  # None until the first poll
    reason: str = "not polled yet"
    model_checked_at_poll: int | None = None
    polls: int = 0
    slow_polls: int = 0  # consecutive polls that timed out
    reading: VllmMetrics | None = None
    rates: Rates = field(default_factory=Rates)

    @property
    def routable(self) -> bool:
        return bool(self.healthy) and self.breaker.available()


# Poll failures that mean the server is gone or hung (not merely misconfigured): in-flight requests that are still
# waiting for their answer to begin are retried elsewhere. A slow poll counts only after `slow_polls_unhealthy`.
_LOST = frozenset({"timeout", "unreachable", "http_status"})


async def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def _endpoint_id(base_url: str) -> str:
    parts = urlsplit(base_url)
    return parts.netloc or base_url


def _base_url(host: str, port: int, scheme: str) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


class CloudPoller:
    """The servers of one cloud tier (`servers`, by endpoint id) and the task that polls them.

    What a poll learns goes onto each server's `Endpoint` (load, status, rates), the tier's metrics and the
    selector's prefix memory (sized to each server's KV cache, emptied when the server restarted).
    """

    def __init__(self, settings: CloudPoolSettings, metrics: CloudMetrics, memory: PrefixMemory, *,
                 resolver: Resolver | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.tier = settings.tier
        self.servers: dict[str, CloudServer] = {}
        self._metrics = metrics
        self._memory = memory
        self._resolver: Resolver = resolver or _getaddrinfo
        self._clock = clock
        self._slow_polls_unhealthy = max(1, settings.slow_polls_unhealthy)
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._polling = asyncio.Lock()
        self._next_dns = 0.0
        for url in settings.endpoints:
            self._add(url.rstrip("/"), static=True)

    async def start(self) -> None:
        """Open the HTTP session, resolve DNS and poll every server once, then keep polling."""
        if self._task is not None:
            return
        self._stopping = False
        timeout = self.settings.poll_timeout_s
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=4, keepalive_timeout=30, resolver=GuardedResolver(),
                                           ssl=self.settings.access.connector_ssl),
            headers=self.settings.access.headers,  # vLLM guards /v1/models with its --api-key
            timeout=aiohttp.ClientTimeout(total=timeout, connect=timeout),
        )
        await self.refresh()
        self._task = asyncio.create_task(self._run(), name=f"cloud-pool-{self.tier}")

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def refresh(self, force_dns: bool = False) -> None:
        """One round: re-resolve DNS when due (or forced), then poll every server."""
        async with self._polling:  # refresh() and the background loop never poll a server twice at once
            now = self._clock()
            if self.settings.dns and (force_dns or now >= self._next_dns):
                self._next_dns = now + self.settings.dns_interval_s
                await self._discover()
            await asyncio.gather(*(self._poll(s) for s in list(self.servers.values())))

    def sync_breaker_gauge(self, server: CloudServer) -> None:
        state = server.breaker.state
        server.endpoint.extra["breaker"] = state.name.lower()
        self._metrics.breaker_state.labels(self.tier, server.endpoint.id).set(int(state))

    # -- membership -------------------------------------------------------------------------------

    def _add(self, base_url: str, *, static: bool) -> CloudServer:
        ep_id = _endpoint_id(base_url)
        existing = self.servers.get(ep_id)
        if existing is not None:
            existing.static |= static
            return existing
        s = self.settings
        server = CloudServer(
            endpoint=Endpoint(id=ep_id, base_url=base_url, model=s.model, tier=self.tier, slots=s.slots,
                              headers=dict(s.access.headers)),
            static=static,
            breaker=CircuitBreaker(s.breaker_threshold, s.breaker_open_s, clock=self._clock, min_sources=2),
            window=Window(s.rate_window_s),
        )
        server.endpoint.extra["status"] = "not polled yet"
        self.servers[ep_id] = server
        self._metrics.endpoints.labels(self.tier).set(len(self.servers))
        self._metrics.endpoint_healthy.labels(self.tier, ep_id).set(0)
        self._metrics.breaker_state.labels(self.tier, ep_id).set(0)
        return server

    async def _discover(self) -> None:
        dns, port, scheme = self.settings.dns, self.settings.port, self.settings.scheme
        if not dns:
            return
        try:
            async with asyncio.timeout(self.settings.poll_timeout_s):
                addresses = await self._resolver(dns, port)
        except (OSError, TimeoutError) as exc:
            log.warning("cloud dns resolution failed; keeping known endpoints", tier=self.tier, dns=dns,
                        error=str(exc) or type(exc).__name__, known=len(self.servers))
            return
        found = {_endpoint_id(_base_url(a, port, scheme)): a for a in addresses}
        for ep_id, address in found.items():
            if ep_id not in self.servers:
                self._add(_base_url(address, port, scheme), static=False)
                log.info("cloud endpoint discovered", tier=self.tier, endpoint=ep_id, dns=dns)
        for ep_id, server in list(self.servers.items()):
            if not server.static and ep_id not in found:
                del self.servers[ep_id]
                self._memory.set_capacity(ep_id, None)
                self._metrics.forget(self.tier, ep_id)
                log.info("cloud endpoint left dns", tier=self.tier, endpoint=ep_id, dns=dns)
        self._metrics.endpoints.labels(self.tier).set(len(self.servers))

    # -- polling ------------------------------------------------------------------------------------

    async def _run(self) -> None:
        # start() has just polled: wait a period first.
        started = self._clock()
        while not self._stopping:  # as well as the cancellation, in case a library call loses it
            await asyncio.sleep(max(0.0, self.settings.poll_interval_s - (self._clock() - started)))
            started = self._clock()
            try:
                await self.refresh()
            except Exception:  # never let the poller die: log and try again next round
                log.exception("cloud pool poll round failed", tier=self.tier)

    async def _poll(self, server: CloudServer) -> None:
        server.polls += 1
        assert self._session is not None, "CloudPool.start() was not awaited"
        s = self.settings
        check_model = (server.model_checked_at_poll is None
                       or server.polls - server.model_checked_at_poll >= s.model_check_every)
        try:
            async with asyncio.timeout(s.poll_timeout_s):  # not wait_for: 3.11's can lose a cancellation
                reading = await probe(self._session, server.endpoint.base_url, s.model if check_model else None,
                                      self.tier)
            if check_model:
                server.model_checked_at_poll = server.polls
        except Unhealthy as exc:
            self._mark(server, None, exc.kind, exc.reason)
        except TimeoutError:
            # A busy vLLM answers /metrics late; only a run of slow polls means slow or hung.
            server.slow_polls += 1
            if server.healthy and server.slow_polls < self._slow_polls_unhealthy:
                self._metrics.poll_failures.labels(self.tier, server.endpoint.id, "timeout").inc()
                return
            self._mark(server, None, "timeout",
                       f"no answer within {s.poll_timeout_s:g}s in {server.slow_polls} polls (slow or hung)")
        except (aiohttp.ClientError, OSError) as exc:
            self._mark(server, None, "unreachable", f"unreachable: {type(exc).__name__}: {exc}")
        else:
            self._mark(server, reading, None, "ok")

    def _mark(self, server: CloudServer, reading: VllmMetrics | None, kind: str | None, reason: str) -> None:
        ep = server.endpoint
        healthy = reading is not None
        if kind != "timeout":
            server.slow_polls = 0
        if healthy != server.healthy:
            if healthy:
                log.info("cloud endpoint healthy", tier=self.tier, endpoint=ep.id, url=ep.base_url)
            else:
                log.warning("cloud endpoint unhealthy", tier=self.tier, endpoint=ep.id, url=ep.base_url, reason=reason)
        elif not healthy and reason != server.reason:
            log.warning("cloud endpoint still unhealthy", tier=self.tier, endpoint=ep.id, reason=reason)
        server.healthy = healthy
        server.reason = reason
        ep.extra["status"] = reason
        self._metrics.endpoint_healthy.labels(self.tier, ep.id).set(1 if healthy else 0)
        if reading is None:
            if kind in _LOST:  # requests waiting for this server's answer to begin go elsewhere (dispatch)
                ep.declare_lost(reason)
            if kind == "unreachable":  # the process is gone: whatever comes back starts with an empty cache
                self._memory.forget(ep.id)
            server.model_checked_at_poll = None  # re-check the model when it comes back
            self._metrics.poll_failures.labels(self.tier, ep.id, kind or "unknown").inc()
        else:
            self._read(server, reading)
        self.sync_breaker_gauge(server)

    def _read(self, server: CloudServer, reading: VllmMetrics) -> None:
        """A healthy poll's /metrics reading onto the server's endpoint, the prefix memory and the metrics."""
        ep, memory, max_context = server.endpoint, self._memory, self.settings.max_context
        if server.reading is not None and reading.restarted_after(server.reading):  # counters fell
            log.info("cloud endpoint restarted: its prefix cache is empty", tier=self.tier, endpoint=ep.id)
            memory.forget(ep.id)
        memory.set_capacity(ep.id, reading.kv_tokens)
        server.reading = reading
        if warning := context_mismatch(ep, max_context, reading.max_model_len):
            log.warning("tier_context_larger_than_server", tier=self.tier, endpoint=ep.id, message=warning,
                        max_context=max_context, server_context=reading.max_model_len)
        server.rates = server.window.add(reading, self._clock())
        ep.reported_load = max((reading.running + reading.waiting) / max(ep.slots, 1), reading.kv_cache_usage)
        ep.extra.update(
            running=reading.running,
            waiting=reading.waiting,
            kv_cache_usage=reading.kv_cache_usage,
            prefix_cache_hit_rate=server.rates.prefix_cache_hit_rate,
            spec_acceptance_rate=server.rates.spec_acceptance_rate,
            spec_mean_accepted_length=server.rates.spec_mean_accepted_length,
        )
        self._metrics.record_reading(self.tier, ep.id, ep.load(), reading, server.rates, memory.size(ep.id)[0])
