"""The tiers a gateway serves: one pool of backends and one admission queue per tier of the active policy.

A `Routing` is one policy version with the tiers built for it; a request holds one from its check to its
settlement (`Tiers.hold`), so that it is decided and dispatched under the same version. Everything outside this
module reads tiers through the public, read-only `Tier` records: dispatch, /v1/models, edge registration and the
status page.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, overload

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core.errors import not_found
from tiergate.core.pool import Pool
from tiergate.gateway.admission import Admission
from tiergate.gateway.pools.access import BackendAccess, tier_headers
from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.edge import EdgePool
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.policies.model import Policy
from tiergate.policies.store import ActivePolicy
from tiergate.policies.tier_config import TierConfig

__all__ = ["Routing", "RoutingHold", "Tier", "Tiers", "cloud_settings", "make_pool"]


@dataclass(frozen=True, slots=True)
class Tier:
    """One tier as the gateway serves it: its policy config, its backends and its admission queue."""

    name: str
    config: TierConfig
    pool: Pool
    admission: Admission

    @property
    def describe(self) -> str:
        """What /v1/models says of it."""
        text = f"{self.config.kind} tier `{self.name}`"
        if self.config.stand_in:
            text += " — LOCAL STAND-IN (llama.cpp on this machine), not vLLM"
        return text


def make_pool(config: TierConfig, redis: AnyRedis | None, cloud_metrics: CloudMetrics,
              access: BackendAccess | None = None) -> Pool:
    """The pool for a tier: edge nodes (registration by heartbeat, static endpoints polled) or vLLM servers.

    A cloud tier marked `stand_in` is a llama.cpp server, not vLLM, so it gets the generic edge pool. `access` is
    the gateway's (its TLS context and edge secret); the tier's own key is added from its `api_key_env`.
    """
    model = config.served_model or config.model
    base = access or BackendAccess()
    tier_access = BackendAccess(tier_headers(config.name, config.api_key_env), base.tls, base.edge_secret)
    if config.kind == "edge" or config.stand_in:
        return EdgePool(config.name, list(config.endpoints), model, redis=redis, max_context=config.max_context,
                        access=tier_access)
    return CloudPool(cloud_settings(config, tier_access), metrics=cloud_metrics)


def cloud_settings(config: TierConfig, access: BackendAccess | None = None) -> CloudPoolSettings:
    """A cloud tier's pool settings from its config: what `discovery` and `routing` say, else the pool's defaults."""
    options: dict[str, Any] = {}
    if (discovery := config.discovery) is not None:
        options.update(dns=discovery.dns, port=discovery.port, dns_interval_s=discovery.interval_s,
                       scheme=discovery.scheme)
    if (routing := config.routing) is not None:
        options.update(strategy=routing.strategy, load_bound=routing.load_bound,
                       cached_load_bound=routing.cached_load_bound, affinity_chars=routing.affinity_chars)
        if routing.max_num_seqs:
            options.update(slots=routing.max_num_seqs)
    if access is not None:
        options.update(access=access)
    return CloudPoolSettings(config.name, config.served_model or config.model, tuple(config.endpoints),
                             max_context=config.max_context, **options)


def capacity_of(config: TierConfig, pool: Pool) -> Callable[[], int]:
    """How many requests the tier takes at once before queueing: the config's cap, else what the backends say.

    Without an explicit cap the tier is saturated when every slot of every healthy backend is busy, plus a queue
    of the same size at the backends themselves (they batch; a little queueing there keeps them full).
    """
    fixed = config.max_concurrency
    if fixed:
        return lambda: fixed
    return lambda: max(1, 2 * sum(ep.slots for ep in pool.endpoints()))


@dataclass(frozen=True, slots=True, eq=False)
class Routing:
    """One version of the routing: a policy and the tiers built for it.

    A request reads one `Routing` from its check to its settlement, so it is classified and decided under the same
    policy whose tiers it is dispatched to; a reload makes a new one current only once all of its pools are up.
    """

    active: ActivePolicy
    tiers: Mapping[str, Tier]

    @property
    def policy(self) -> Policy:
        return self.active.policy

    @property
    def version(self) -> str:
        return self.active.version


class RoutingHold:
    """A request's claim on its `Routing`: the pools of a version no longer current stop once no claim is left.

    Given back once, by whoever ends the request (`release` again does nothing)."""

    __slots__ = ("_release", "routing")

    def __init__(self, routing: Routing, release: Callable[[Routing], None]) -> None:
        self.routing = routing
        self._release: Callable[[Routing], None] | None = release

    def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release(self.routing)


class Tiers(Mapping[str, Tier]):
    """The routing a gateway serves: the current `Routing`, the tiers of it by name, and the older versions that
    requests still hold.

    A reload builds the new version's pools first (keeping the pool of a tier whose config did not change: its
    health, load and registrations survive), then makes it current in one step. A pool only an older version
    uses is stopped once the last request holding that version has ended, so a request in a tier's queue across a
    reload is still served by the tier it was decided for.
    """

    def __init__(self, redis: AnyRedis | None, cloud_metrics: CloudMetrics,
                 access: BackendAccess | None = None) -> None:
        self._redis = redis
        self._cloud_metrics = cloud_metrics
        self._access = access
        self._current: Routing | None = None
        self._holders: dict[Routing, int] = {}  # versions requests still hold (the current one always listed)
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def current(self) -> Routing:
        if self._current is None:
            raise RuntimeError("no routing yet: the gateway has not started")
        return self._current

    def __getitem__(self, name: str) -> Tier:
        return self.current.tiers[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current.tiers if self._current is not None else ())

    def __len__(self) -> int:
        return len(self._current.tiers) if self._current is not None else 0

    @overload
    def hold(self) -> RoutingHold: ...

    @overload
    def hold(self, routing: Routing) -> RoutingHold | None: ...

    def hold(self, routing: Routing | None = None) -> RoutingHold | None:
        """The current version (or `routing`, while something still holds it: else None), held until given back."""
        if routing is None:
            routing = self.current
        elif routing not in self._holders:
            return None
        self._holders[routing] = self._holders.get(routing, 0) + 1
        return RoutingHold(routing, self._release)

    @property
    def held_versions(self) -> int:
        """Versions still held by requests, the current one included."""
        return len(self._holders)

    async def sync(self, active: ActivePolicy) -> None:
        """Build a pool per tier of `active` (keeping those whose config did not change), then make it current."""
        old = self._current
        kept = old.tiers if old is not None else {}
        new: dict[str, Tier] = {}
        started: list[Pool] = []
        try:
            for name, config in active.policy.tiers.items():
                was = kept.get(name)
                if was is not None and was.config == config:
                    new[name] = was
                    continue
                pool = make_pool(config, self._redis, self._cloud_metrics, self._access)
                started.append(pool)
                await pool.start()
                new[name] = Tier(name, config, pool, Admission(capacity_of(config, pool),
                                                               max_waiting=config.queue.max_waiting))
        except BaseException:  # the old version keeps serving; what was built for the new one goes
            for pool in started:
                await pool.stop()
            raise
        routing = self._current = Routing(active, MappingProxyType(new))
        self._holders[routing] = 0
        if old is not None:
            self._release_current(old)

    def _release_current(self, old: Routing) -> None:
        """`old` is no longer current: retire it now if nothing holds it."""
        if self._holders.get(old) == 0:
            del self._holders[old]
            self._stop_unused(old)

    def _release(self, routing: Routing) -> None:
        held = self._holders.get(routing)
        if held is None:  # the gateway stopped every pool already
            return
        left = held - 1
        if left or routing is self._current:
            self._holders[routing] = left
            return
        del self._holders[routing]
        self._stop_unused(routing)

    def _stop_unused(self, retired: Routing) -> None:
        """Stop the pools of `retired` that no version still held uses (`_release` runs in sync code: a task)."""
        live = {id(t.pool) for routing in self._holders for t in routing.tiers.values()}
        for tier in retired.tiers.values():
            if id(tier.pool) not in live:
                task = asyncio.get_running_loop().create_task(tier.pool.stop(), name=f"tier-stop-{tier.name}")
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        """Stop every pool of every version still held, and wait for those already stopping."""
        pools = {id(t.pool): t.pool for routing in self._holders for t in routing.tiers.values()}
        self._holders.clear()
        for pool in pools.values():
            await pool.stop()
        if self._stopping:
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def edge_pool(self, name: str | None) -> EdgePool:
        """The pool an edge node registers with: the named edge tier, or the first one; 404 when there is none."""
        for tier in self.values():
            if tier.config.kind == "edge" and (not name or tier.name == name) and isinstance(tier.pool, EdgePool):
                return tier.pool
        raise not_found(f"No edge tier {name or ''} in the active policy.", code="no_edge_tier")

    def health(self) -> dict[str, bool]:
        return {name: tier.pool.healthy() for name, tier in self.items()}

    def throughput(self, name: str) -> float | None:
        """The mean generated tokens per second of a tier's nodes that generated anything in their last window,
        as their heartbeats report it (a `throughput: live` tier's price per token comes from it); None when no
        node of the tier has (an idle node's cost is not spread over its neighbours' tokens)."""
        tier = self.current.tiers.get(name) if self._current is not None else None
        if tier is None:
            return None
        rates = [r for ep in tier.pool.endpoints()
                 if isinstance(r := ep.extra.get("tokens_per_s"), (int, float)) and r > 0]
        return sum(rates) / len(rates) if rates else None

    def models(self) -> Mapping[str, Tier]:
        """Public model name → tier."""
        return {t.config.model: t for t in self.values()}
