"""The gateway's view of a tier of vLLM servers: who is up, how busy, and who should take a request.

A background task polls every server's `/health`, `/metrics` and (now and then) `/v1/models`
with bounded timeouts over one pooled aiohttp session, and re-resolves the discovery DNS name
(a Kubernetes headless Service resolves to one address per ready pod). `candidates()` runs on
every request and only reads what the poller stored, so it never waits on the network.

A server takes traffic when its last poll passed (answers, is vLLM, serves the tier's model) and
its circuit breaker, fed by `report()` from dispatch, is closed; a half-open breaker gets one
trial request, placed first. A refused connection, an error status or a wrong model counts at
once; a poll that merely times out counts only after `slow_polls_unhealthy` in a row, because a
vLLM server saturated by traffic answers /metrics late and must not flap out of the pool.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

import aiohttp
import structlog

from tiergate.core.pool import Endpoint, context_mismatch
from tiergate.core.tasks import cancel_and_wait
from tiergate.gateway.pools.breaker import BreakerState, CircuitBreaker
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.pools.probe import Unhealthy, probe
from tiergate.gateway.pools.selection import Reason, Selector, Strategy
from tiergate.gateway.pools.vllm_metrics import Rates, VllmMetrics, Window

if TYPE_CHECKING:
    from tiergate.core.types import Features
    from tiergate.core.wire import ParsedRequest

__all__ = ["CloudPool", "PoolSnapshot", "Resolver"]

log = structlog.get_logger("tiergate.cloud_pool")

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""Resolves a DNS name to IP addresses (injectable for tests)."""


@dataclass(slots=True)
class _Server:
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


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Tier-level summary for load-sensitive policy decisions and status pages."""

    total: int
    routable: int
    mean_load: float  # over routable servers; 1.0 means every slot busy
    waiting: float  # requests queued inside vLLM across the tier
    spec_acceptance_rate: float | None  # mean over routable servers that report it
    prefix_cache_hit_rate: float | None


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


class CloudPool:
    """`core.pool.Pool` over vLLM servers from a static list and/or a DNS name.

    `model` is the served model name each server must list in /v1/models (and what dispatch sends
    upstream). `slots` is each server's `max_num_seqs`, the denominator of its load.
    """

    def __init__(
        self,
        tier: str,
        model: str,
        endpoints: Sequence[str] = (),
        dns: str | None = None,
        port: int = 8000,
        *,
        strategy: Strategy = "prefix",
        poll_interval_s: float = 1.0,
        poll_timeout_s: float = 2.0,
        dns_interval_s: float = 10.0,
        slots: int = 256,
        load_bound: float = 1.2,
        cached_load_bound: float | None = None,
        affinity_chars: int = 256,
        breaker_threshold: int = 3,
        breaker_open_s: float = 10.0,
        slow_polls_unhealthy: int = 3,
        model_check_every: int = 30,
        rate_window_s: float = 60.0,
        scheme: str = "http",
        resolver: Resolver | None = None,
        clock: Callable[[], float] = time.monotonic,
        metrics: CloudMetrics | None = None,
        max_context: int | None = None,
    ) -> None:
        if not endpoints and not dns:
            raise ValueError(f"cloud tier {tier!r}: give static endpoints, a DNS name, or both")
        self.tier = tier
        self.model = model
        self.max_context = max_context  # what the tier's policy promises; a server serving less is warned about
        self.metrics = metrics or CloudMetrics()  # the gateway passes the one on its registry
        self.dns = dns
        self.port = port
        self.scheme = scheme
        self.poll_interval_s = poll_interval_s
        self.poll_timeout_s = poll_timeout_s
        self.dns_interval_s = dns_interval_s
        self.slots = slots
        self.model_check_every = model_check_every
        self.slow_polls_unhealthy = max(1, slow_polls_unhealthy)
        self.selector = Selector(strategy, bound=load_bound, cached_bound=cached_load_bound,
                                 affinity_chars=affinity_chars)
        self._breaker_threshold = breaker_threshold
        self._breaker_open_s = breaker_open_s
        self._rate_window_s = rate_window_s
        self._resolver: Resolver = resolver or _getaddrinfo
        self._clock = clock
        self._servers: dict[str, _Server] = {}
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._polling = asyncio.Lock()
        self._next_dns = 0.0
        for url in endpoints:
            self._add(url.rstrip("/"), static=True)

    @property
    def strategy(self) -> Strategy:
        return self.selector.strategy

    # -- Pool protocol -------------------------------------------------------------------------

    def candidates(self, request: ParsedRequest, features: Features | None = None) -> list[Endpoint]:
        """Routable endpoints, best first (a half-open server's single trial goes first)."""
        servers = [s for s in self._servers.values() if s.healthy and s.breaker.available()]
        probe = next((s for s in servers if s.breaker.state is BreakerState.HALF_OPEN), None)
        closed = [s.endpoint for s in servers if s.breaker.state is BreakerState.CLOSED]
        choice = self.selector.order(request, closed, features.prompt_tokens if features is not None else None)
        order = choice.order if choice else []
        reason: Reason | Literal["probe"] | None = choice.reason if choice else None
        if probe is not None and probe.breaker.acquire():
            order = [probe.endpoint, *order]
            reason = "probe"
        if reason is not None:
            self.metrics.selections.labels(self.tier, self.strategy, reason).inc()
        return order

    def report(self, endpoint: Endpoint, ok: bool) -> None:
        server = self._servers.get(endpoint.id)
        if server is None:
            return  # left the pool (DNS) while the request was in flight
        before = server.breaker.state
        after = server.breaker.record(ok)
        if after is not before:
            self._breaker_changed(server, before, after)

    def healthy(self) -> bool:
        return any(s.healthy and s.breaker.available() for s in self._servers.values())

    def endpoints(self) -> list[Endpoint]:
        return [s.endpoint for s in self._servers.values()]

    async def start(self) -> None:
        """Open the HTTP session, resolve DNS and poll every server once, then keep polling."""
        if self._task is not None:
            return
        self._stopping = False
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64, limit_per_host=4, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=self.poll_timeout_s, connect=self.poll_timeout_s),
        )
        await self._refresh()
        self._task = asyncio.create_task(self._run(), name=f"cloud-pool-{self.tier}")

    async def stop(self) -> None:
        self._stopping = True
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- status for policy, status pages and tests ----------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        routable = [s for s in self._servers.values() if s.healthy and s.breaker.available()]
        acc = [s.rates.spec_acceptance_rate for s in routable if s.rates.spec_acceptance_rate is not None]
        hit = [s.rates.prefix_cache_hit_rate for s in routable if s.rates.prefix_cache_hit_rate is not None]
        return PoolSnapshot(
            total=len(self._servers),
            routable=len(routable),
            mean_load=sum(s.endpoint.load() for s in routable) / len(routable) if routable else 1.0,
            waiting=sum(s.reading.waiting for s in routable if s.reading is not None),
            spec_acceptance_rate=sum(acc) / len(acc) if acc else None,
            prefix_cache_hit_rate=sum(hit) / len(hit) if hit else None,
        )

    def reading(self, endpoint_id: str) -> VllmMetrics | None:
        """The last /metrics reading of one server (cumulative counters included)."""
        server = self._servers.get(endpoint_id)
        return server.reading if server else None

    async def refresh(self) -> None:
        """Poll now instead of waiting for the next round (tests, admin 'refresh')."""
        await self._refresh(force_dns=True)

    # -- membership -------------------------------------------------------------------------------

    def _add(self, base_url: str, *, static: bool) -> _Server:
        ep_id = _endpoint_id(base_url)
        existing = self._servers.get(ep_id)
        if existing is not None:
            existing.static |= static
            return existing
        server = _Server(
            endpoint=Endpoint(id=ep_id, base_url=base_url, model=self.model, tier=self.tier, slots=self.slots),
            static=static,
            breaker=CircuitBreaker(self._breaker_threshold, self._breaker_open_s, clock=self._clock),
            window=Window(self._rate_window_s),
        )
        server.endpoint.extra["status"] = "not polled yet"
        self._servers[ep_id] = server
        self.metrics.endpoints.labels(self.tier).set(len(self._servers))
        self.metrics.endpoint_healthy.labels(self.tier, ep_id).set(0)
        self.metrics.breaker_state.labels(self.tier, ep_id).set(0)
        return server

    async def _discover(self) -> None:
        if not self.dns:
            return
        try:
            async with asyncio.timeout(self.poll_timeout_s):
                addresses = await self._resolver(self.dns, self.port)
        except (OSError, TimeoutError) as exc:
            log.warning("cloud dns resolution failed; keeping known endpoints", tier=self.tier, dns=self.dns,
                        error=str(exc) or type(exc).__name__, known=len(self._servers))
            return
        found = {_endpoint_id(_base_url(a, self.port, self.scheme)): a for a in addresses}
        for ep_id, address in found.items():
            if ep_id not in self._servers:
                self._add(_base_url(address, self.port, self.scheme), static=False)
                log.info("cloud endpoint discovered", tier=self.tier, endpoint=ep_id, dns=self.dns)
        for ep_id, server in list(self._servers.items()):
            if not server.static and ep_id not in found:
                del self._servers[ep_id]
                self.selector.memory.set_capacity(ep_id, None)
                self.metrics.forget(self.tier, ep_id)
                log.info("cloud endpoint left dns", tier=self.tier, endpoint=ep_id, dns=self.dns)
        self.metrics.endpoints.labels(self.tier).set(len(self._servers))

    # -- polling ------------------------------------------------------------------------------------

    async def _run(self) -> None:
        # start() has just polled: wait a period first.
        started = self._clock()
        while not self._stopping:  # as well as the cancellation, in case a library call loses it
            await asyncio.sleep(max(0.0, self.poll_interval_s - (self._clock() - started)))
            started = self._clock()
            try:
                await self._refresh()
            except Exception:  # never let the poller die: log and try again next round
                log.exception("cloud pool poll round failed", tier=self.tier)

    async def _refresh(self, force_dns: bool = False) -> None:
        async with self._polling:  # refresh() and the background loop never poll a server twice at once
            now = self._clock()
            if self.dns and (force_dns or now >= self._next_dns):
                self._next_dns = now + self.dns_interval_s
                await self._discover()
            await asyncio.gather(*(self._poll(s) for s in list(self._servers.values())))

    async def _poll(self, server: _Server) -> None:
        server.polls += 1
        assert self._session is not None, "CloudPool.start() was not awaited"
        check_model = (server.model_checked_at_poll is None
                       or server.polls - server.model_checked_at_poll >= self.model_check_every)
        try:
            async with asyncio.timeout(self.poll_timeout_s):  # not wait_for: 3.11's can lose a cancellation
                reading = await probe(self._session, server.endpoint.base_url, self.model if check_model else None,
                                      self.tier)
            if check_model:
                server.model_checked_at_poll = server.polls
        except Unhealthy as exc:
            self._mark(server, None, exc.kind, exc.reason)
        except TimeoutError:
            # A busy vLLM answers /metrics late; only a run of slow polls means slow or hung.
            server.slow_polls += 1
            if server.healthy and server.slow_polls < self.slow_polls_unhealthy:
                self.metrics.poll_failures.labels(self.tier, server.endpoint.id, "timeout").inc()
                return
            self._mark(server, None, "timeout",
                       f"no answer within {self.poll_timeout_s:g}s in {server.slow_polls} polls (slow or hung)")
        except (aiohttp.ClientError, OSError) as exc:
            self._mark(server, None, "unreachable", f"unreachable: {type(exc).__name__}: {exc}")
        else:
            self._mark(server, reading, None, "ok")

    def _mark(self, server: _Server, reading: VllmMetrics | None, kind: str | None, reason: str) -> None:
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
        self.metrics.endpoint_healthy.labels(self.tier, ep.id).set(1 if healthy else 0)
        if reading is None:
            if kind in _LOST:  # requests waiting for this server's answer to begin go elsewhere (dispatch)
                ep.declare_lost(reason)
            if kind == "unreachable":  # the process is gone: whatever comes back starts with an empty cache
                self.selector.memory.forget(ep.id)
            server.model_checked_at_poll = None  # re-check the model when it comes back
            self.metrics.poll_failures.labels(self.tier, ep.id, kind or "unknown").inc()
            self._sync_breaker_gauge(server)
            return
        memory = self.selector.memory  # sized to the server's KV cache; emptied when it restarted (counters fell)
        if server.reading is not None and reading.restarted_after(server.reading):
            log.info("cloud endpoint restarted: its prefix cache is empty", tier=self.tier, endpoint=ep.id)
            memory.forget(ep.id)
        memory.set_capacity(ep.id, reading.kv_tokens)
        server.reading = reading
        if warning := context_mismatch(ep, self.max_context, reading.max_model_len):
            log.warning("tier_context_larger_than_server", tier=self.tier, endpoint=ep.id, message=warning,
                        max_context=self.max_context, server_context=reading.max_model_len)
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
        self.metrics.record_reading(self.tier, ep.id, ep.load(), reading, server.rates, memory.size(ep.id)[0])
        self._sync_breaker_gauge(server)

    def _sync_breaker_gauge(self, server: _Server) -> None:
        state = server.breaker.state
        server.endpoint.extra["breaker"] = state.name.lower()
        self.metrics.breaker_state.labels(self.tier, server.endpoint.id).set(int(state))

    def _breaker_changed(self, server: _Server, before: BreakerState, after: BreakerState) -> None:
        ep = server.endpoint
        if after is BreakerState.OPEN:
            self.metrics.breaker_opened.labels(self.tier, ep.id).inc()
            log.warning("cloud endpoint circuit open", tier=self.tier, endpoint=ep.id,
                        consecutive_failures=server.breaker.consecutive_failures, open_s=server.breaker.open_s)
        elif after is BreakerState.CLOSED:
            log.info("cloud endpoint circuit closed", tier=self.tier, endpoint=ep.id, was=before.name.lower())
        self._sync_breaker_gauge(server)
