"""The tiers a gateway serves: one pool of backends and one admission queue per tier of the active policy.

`Tiers` is rebuilt from the policy on every reload, keeping the pool of a tier whose config did not change (its
health, load and registrations survive a reload). Everything outside this module reads it through the public,
read-only `Tier` records: dispatch, /v1/models, edge registration and the status page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core.errors import not_found
from tiergate.core.pool import Pool
from tiergate.gateway.admission import Admission
from tiergate.gateway.pools.cloud import CloudPool, CloudPoolSettings
from tiergate.gateway.pools.edge import EdgePool
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.policies.model import Policy
from tiergate.policies.tier_config import TierConfig

__all__ = ["Tier", "Tiers", "cloud_settings", "make_pool"]


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


def make_pool(config: TierConfig, redis: AnyRedis | None, cloud_metrics: CloudMetrics) -> Pool:
    """The pool for a tier: edge nodes (registration by heartbeat, static endpoints polled) or vLLM servers.

    A cloud tier marked `stand_in` is a llama.cpp server, not vLLM, so it gets the generic edge pool.
    """
    model = config.served_model or config.model
    if config.kind == "edge" or config.stand_in:
        return EdgePool(config.name, list(config.endpoints), model, redis=redis, max_context=config.max_context)
    return CloudPool(cloud_settings(config), metrics=cloud_metrics)


def cloud_settings(config: TierConfig) -> CloudPoolSettings:
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


class Tiers(Mapping[str, Tier]):
    """The tiers of the active policy, by name; a read-only mapping between reloads."""

    def __init__(self, redis: AnyRedis | None, cloud_metrics: CloudMetrics) -> None:
        self._redis = redis
        self._cloud_metrics = cloud_metrics
        self._by_name: dict[str, Tier] = {}

    def __getitem__(self, name: str) -> Tier:
        return self._by_name[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    async def sync(self, policy: Policy) -> None:
        """Build a pool per tier of `policy`; keep the pools whose tier config did not change."""
        new: dict[str, Tier] = {}
        for name, config in policy.tiers.items():
            old = self._by_name.get(name)
            if old is not None and old.config == config:
                new[name] = old
                continue
            pool = make_pool(config, self._redis, self._cloud_metrics)
            await pool.start()
            new[name] = Tier(name, config, pool, Admission(capacity_of(config, pool),
                                                           max_waiting=config.queue.max_waiting))
        stale = [t for n, t in self._by_name.items() if new.get(n) is not t]
        self._by_name = new
        for tier in stale:
            await tier.pool.stop()

    async def stop(self) -> None:
        for tier in self._by_name.values():
            await tier.pool.stop()

    def edge_pool(self, name: str | None) -> EdgePool:
        """The pool an edge node registers with: the named edge tier, or the first one; 404 when there is none."""
        for tier in self._by_name.values():
            if tier.config.kind == "edge" and (not name or tier.name == name) and isinstance(tier.pool, EdgePool):
                return tier.pool
        raise not_found(f"No edge tier {name or ''} in the active policy.", code="no_edge_tier")

    def health(self) -> dict[str, bool]:
        return {name: tier.pool.healthy() for name, tier in self._by_name.items()}

    def models(self) -> Mapping[str, Tier]:
        """Public model name → tier."""
        return {t.config.model: t for t in self._by_name.values()}
