"""The gateway's view of an edge tier: which edge nodes exist, how loaded they are, which to try first.

Nodes come from two places, kept by `gateway.pools.edge_registry`: heartbeats (shared between gateway replicas
through Redis when there is one) and static endpoints in the tier config. `gateway.pools.edge_health` polls them
all. `candidates()` runs on every request, so it only reads the in-memory snapshot: least loaded first, where
load = max(our in-flight / slots, reported (busy+queued) / slots), round-robin among equals; `report()` puts an
endpoint whose requests keep failing on a growing cool-down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import aiohttp
import structlog

from tiergate.gateway.pools.access import BackendAccess
from tiergate.gateway.pools.backend_dns import GuardedResolver
from tiergate.gateway.pools.breaker import CircuitBreaker
from tiergate.gateway.pools.edge_health import EdgeHealth
from tiergate.gateway.pools.edge_registry import (
    EdgeRegistry,
    HeartbeatError,
    NodeInfo,
    NodeOwned,
    last_seen,
    parse_heartbeat,
)

if TYPE_CHECKING:
    from tiergate.cache.redis.conn import AnyRedis
    from tiergate.core.pool import Endpoint
    from tiergate.core.types import Features
    from tiergate.core.wire import ParsedRequest

__all__ = ["EdgePool", "HeartbeatError", "NodeInfo", "NodeOwned", "parse_heartbeat"]

log = structlog.get_logger("edge_node.pool")


class EdgePool:
    """Selection over the nodes of one edge tier, with a cool-down per failing node; implements core.pool.Pool."""

    def __init__(
        self,
        tier: str,
        static_endpoints: Sequence[str] = (),
        model: str = "",
        redis: AnyRedis | None = None,
        ttl_s: float = 10.0,
        *,
        poll_interval_s: float = 2.0,
        refresh_interval_s: float = 1.0,
        failure_threshold: int = 3,
        cooldown_s: float = 5.0,
        lost_after: int = 2,
        max_context: int | None = None,
        key_prefix: str = "tiergate:edge",
        clock: Callable[[], float] = time.time,
        access: BackendAccess | None = None,
    ) -> None:
        self.tier: str = tier
        self.model = model
        self.ttl_s = ttl_s
        self.max_context = max_context
        self._clock = clock
        self.access = access or BackendAccess()
        self.registry = EdgeRegistry(tier, static_endpoints, model, redis, ttl_s, max_context=max_context,
                                     key_prefix=key_prefix, clock=clock, static_headers=self.access.headers,
                                     node_headers=self.access.node_headers)
        self.health = EdgeHealth(self.registry, poll_interval_s=poll_interval_s, lost_after=lost_after)
        self._refresh_interval = refresh_interval_s
        self._failure_threshold = failure_threshold
        self._cooldown_s = cooldown_s
        self._breakers: dict[str, CircuitBreaker] = {}
        self._rr = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def refreshes(self) -> int:
        """Refreshes from Redis completed (tests wait on it rather than on the clock)."""
        return self.registry.refreshes

    # ------------------------------------------------------------------ Pool protocol

    def candidates(self, request: ParsedRequest | None = None, features: Features | None = None) -> list[Endpoint]:
        """Usable endpoints, least loaded first; equal loads rotate so traffic spreads."""
        now = self._clock()
        usable = [e for e in self.registry.all() if self._usable(e, now)]
        if not usable:
            return []
        usable.sort(key=lambda e: e.id)
        n, rr = len(usable), self._rr
        self._rr += 1
        order = {e.id: (i - rr) % n for i, e in enumerate(usable)}
        usable.sort(key=lambda e: (e.load(), order[e.id]))
        return usable

    def report(self, endpoint: Endpoint, ok: bool, source: str | None = None) -> None:
        """Consecutive failures put an endpoint on a growing cool-down (its circuit breaker, opened for
        `cooldown_s` doubling per further failure, at most 60 s), once they come from two tenants (or from a
        caller that names none); one success clears it. One tenant's requests alone never cool a node down: a
        node that is really down stops answering its health checks (`edge_health`)."""
        if ok:
            self._breakers.pop(endpoint.id, None)
            return
        breaker = self._breakers.get(endpoint.id)
        if breaker is None:
            breaker = self._breakers[endpoint.id] = CircuitBreaker(
                self._failure_threshold, self._cooldown_s, backoff=2.0, max_open_s=60.0, late_failures_reopen=True,
                min_sources=2)
        opened = breaker.opened_count
        breaker.record(False, source)
        if breaker.opened_count != opened:
            log.warning("edge endpoint cooling down", tier=self.tier, endpoint=endpoint.id,
                        failures=breaker.consecutive_failures, seconds=breaker.open_for_s)

    def healthy(self) -> bool:
        now = self._clock()
        return any(self._usable(e, now) for e in self.registry.all())

    def endpoints(self) -> list[Endpoint]:
        return list(self.registry.all())

    async def start(self) -> None:
        if self._tasks:
            return
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.access.connector_ssl, resolver=GuardedResolver()),
            timeout=aiohttp.ClientTimeout(total=min(2.0, self.health.poll_interval_s)))
        self._tasks.append(asyncio.create_task(self.health.run(self._session), name=f"edge-pool-poll-{self.tier}"))
        self._tasks.append(asyncio.create_task(self.registry.keep_fresh(self._refresh_interval),
                                               name=f"edge-pool-refresh-{self.tier}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ registration (gateway/admin.py)

    async def heartbeat(self, info: bytes | Mapping[str, Any] | NodeInfo, *, owner: str = "",
                        authoritative: bool = False) -> Endpoint:
        """Register or refresh a node for `owner` (see `EdgeRegistry.heartbeat`). Raises HeartbeatError on a
        malformed heartbeat, NodeOwned when another owner holds the node id."""
        return await self.registry.heartbeat(info, owner=owner, authoritative=authoritative)

    async def deregister(self, node_id: str, *, owner: str = "", authoritative: bool = False) -> bool:
        """Forget a node now (it is draining). True if it was known; NodeOwned when another owner holds it."""
        known = await self.registry.deregister(node_id, owner=owner, authoritative=authoritative)
        self._breakers.pop(node_id, None)
        return known

    async def refresh(self) -> None:
        """Expire silent nodes and (with Redis) load every node any replica has heard from."""
        await self.registry.refresh()

    # ------------------------------------------------------------------ internals

    def _usable(self, e: Endpoint, now: float) -> bool:
        x = e.extra
        if x.get("draining"):
            return False
        if x.get("source") == "static":
            if not x.get("up", True):
                return False
        elif now - last_seen(e) > self.ttl_s or not x.get("alive", True):
            return False
        breaker = self._breakers.get(e.id)  # only asked: once cooled down, all traffic flows again (no trial)
        return breaker is None or breaker.available()
