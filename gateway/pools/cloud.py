"""The gateway's view of a tier of vLLM servers: who is up, how busy, and who should take a request.

`CloudPool` is what dispatch uses: `candidates()` runs on every request and only reads what the
poller (`gateway.pools.cloud_poller`) stored, so it never waits on the network; `report()` feeds each
server's circuit breaker with how dispatch's requests went.

A server takes traffic when its last poll passed (answers, is vLLM, serves the tier's model) and
its circuit breaker is closed; a half-open breaker gets one trial request, placed first.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import structlog

from tiergate.gateway.pools.breaker import BreakerState
from tiergate.gateway.pools.cloud_poller import CloudPoller, CloudServer, Resolver
from tiergate.gateway.pools.cloud_settings import CloudPoolSettings
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.pools.selection import Reason, Selector, Strategy

if TYPE_CHECKING:
    from tiergate.core.pool import Endpoint
    from tiergate.core.types import Features
    from tiergate.core.wire import ParsedRequest
    from tiergate.gateway.pools.vllm_metrics import VllmMetrics

__all__ = ["CloudPool", "CloudPoolSettings", "PoolSnapshot", "Resolver"]

log = structlog.get_logger("tiergate.cloud_pool")


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Tier-level summary for load-sensitive policy decisions and status pages."""

    total: int
    routable: int
    mean_load: float  # over routable servers; 1.0 means every slot busy
    waiting: float  # requests queued inside vLLM across the tier
    spec_acceptance_rate: float | None  # mean over routable servers that report it
    prefix_cache_hit_rate: float | None


class CloudPool:
    """`core.pool.Pool` over the vLLM servers that `settings` name (a static list and/or a DNS name).

    `metrics` is the gateway's, on its registry; `resolver` and `clock` are injectable for tests.
    """

    def __init__(self, settings: CloudPoolSettings, *, metrics: CloudMetrics | None = None,
                 resolver: Resolver | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.tier = settings.tier
        self.model = settings.model
        self.metrics = metrics or CloudMetrics()
        self.selector = Selector(settings.strategy, bound=settings.load_bound,
                                 cached_bound=settings.cached_load_bound, affinity_chars=settings.affinity_chars)
        self._poller = CloudPoller(settings, self.metrics, self.selector.memory, resolver=resolver, clock=clock)
        self._servers = self._poller.servers  # the poller adds and drops servers; this pool only reads them

    @property
    def strategy(self) -> Strategy:
        return self.selector.strategy

    # -- Pool protocol -------------------------------------------------------------------------

    def candidates(self, request: ParsedRequest, features: Features | None = None) -> list[Endpoint]:
        """Routable endpoints, best first (a half-open server's single trial goes first)."""
        servers = [s for s in self._servers.values() if s.routable]
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

    def report(self, endpoint: Endpoint, ok: bool, source: str | None = None) -> None:
        """Feed the server's breaker; it opens on failures from two tenants (`source`), or from a caller that
        names none: one tenant's failing requests alone do not take a server away (its polls do, if it is down)."""
        server = self._servers.get(endpoint.id)
        if server is None:
            return  # left the pool (DNS) while the request was in flight
        before = server.breaker.state
        after = server.breaker.record(ok, source)
        if after is not before:
            self._breaker_changed(server, before, after)

    def healthy(self) -> bool:
        return any(s.routable for s in self._servers.values())

    def endpoints(self) -> list[Endpoint]:
        return [s.endpoint for s in self._servers.values()]

    async def start(self) -> None:
        """Open the HTTP session, resolve DNS and poll every server once, then keep polling."""
        await self._poller.start()

    async def stop(self) -> None:
        await self._poller.stop()

    # -- status for policy, status pages and tests ----------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        routable = [s for s in self._servers.values() if s.routable]
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
        await self._poller.refresh(force_dns=True)

    def _breaker_changed(self, server: CloudServer, before: BreakerState, after: BreakerState) -> None:
        ep = server.endpoint
        if after is BreakerState.OPEN:
            self.metrics.breaker_opened.labels(self.tier, ep.id).inc()
            log.warning("cloud endpoint circuit open", tier=self.tier, endpoint=ep.id,
                        consecutive_failures=server.breaker.consecutive_failures, open_s=server.breaker.open_s)
        elif after is BreakerState.CLOSED:
            log.info("cloud endpoint circuit closed", tier=self.tier, endpoint=ep.id, was=before.name.lower())
        self._poller.sync_breaker_gauge(server)
