"""The gateway process's state and lifecycle: one `Gateway` object owns everything a request needs.

Its attributes are the public, read-only surface the rest of the package uses: settings, keys, the policy store
and classifier, the tiers (`Tiers`, a read-only mapping of `Tier`), the cache, the tenant limiter, the upstream
client, the metrics registry and the status page's statistics. `startup` and `shutdown` bracket its life;
nothing else creates or replaces these objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import time

import structlog
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tiergate.cache import CacheMetrics, CacheSettings, HttpJudge, SemanticCache, build_cache
from tiergate.cache.judge import Judge
from tiergate.cache.redis.conn import AnyRedis, open_redis
from tiergate.gateway.accounting import Accounting
from tiergate.gateway.admin import AdminKey
from tiergate.gateway.agreement import Agreements
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.budgets import Budgets
from tiergate.gateway.dispatch import Dispatcher
from tiergate.gateway.distill import Distiller, JsonlRecords, RedisRecords
from tiergate.gateway.exploration import Explorations
from tiergate.gateway.history import History
from tiergate.gateway.keys import Keys
from tiergate.gateway.learned_router import LearnedRouter
from tiergate.gateway.ledger import LocalLedger, RedisLedger
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.outcomes import OutcomeRecorder
from tiergate.gateway.pools.access import BackendAccess
from tiergate.gateway.pools.metrics import CloudMetrics
from tiergate.gateway.quarantine import Quarantine
from tiergate.gateway.relay import Relay
from tiergate.gateway.settings import Settings
from tiergate.gateway.settlement import Settlements, SharedCache
from tiergate.gateway.shadow import ShadowChecks
from tiergate.gateway.stats import Stats
from tiergate.gateway.tiers import Tiers
from tiergate.gateway.upstream import UpstreamClient
from tiergate.policies.classify import Classifier
from tiergate.policies.store import ActivePolicy, PolicyMetrics, PolicyStore

__all__ = ["Gateway"]

log = structlog.get_logger("tiergate.gateway")


class Gateway:
    """All of a gateway process's state: settings, keys, policy, classifier, cache, tiers, upstream client."""

    def __init__(self, settings: Settings, *, keyring: KeyRing | None = None,
                 registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        # Shared state across replicas (edge registry, rate limits, key revocations); the client connects on first
        # use. No retries: a heartbeat or a rate-limit check must not take seconds while a node hangs (the limiter
        # fails open; an edge node sends its next heartbeat anyway).
        self.redis: AnyRedis | None = None
        if settings.redis_url:
            self.redis = open_redis(settings.redis_url, socket_timeout=0.5, socket_connect_timeout=0.5,
                                    health_check_interval=10, retry=Retry(NoBackoff(), 0))
        # The tenants' keys: the key file hot-reloaded (unless the caller passed its own ring), revocations shared.
        self.keys = Keys(keyring or _keyring_from(settings), redis=self.redis,
                         path=settings.api_keys_file if keyring is None else None)
        self.admin = AdminKey(settings.admin_key)
        self.registry = registry if registry is not None else _process_registry()
        self.metrics = GatewayMetrics(self.registry)
        self.policy_store = PolicyStore(settings.policy, metrics=PolicyMetrics(self.registry))
        self.classifier = Classifier(self.policy_store)
        self.upstream = UpstreamClient(tls=settings.backend_ssl())  # verifies https:// backends
        self.shared_cache = SharedCache()  # what collaborators read the cache through; start-up fills it
        self.tiers = Tiers(self.redis, CloudMetrics(self.registry),
                           BackendAccess(tls=settings.backend_ssl(), edge_secret=settings.edge_secret))
        self.quarantine = Quarantine(self.redis)  # requests that broke two backends, refused on every replica
        self.dispatcher = Dispatcher(self.upstream, self.metrics, self.quarantine)
        self.limiter = Limiter(self.metrics, self.redis)
        self.stats = Stats()  # the status page's rolling window of recent requests
        self.history = History(self.registry)  # its charts over time and spend table, from the counters
        self.accounting = Accounting(self.metrics, self.stats)
        self.draining = False
        self.started_at = time.time()
        self.distill = Distiller(self.metrics, RedisRecords(self.redis) if self.redis is not None
                                 else JsonlRecords(settings.distill_file))
        # Spend per tenant, key, tier and rule, and the budgets' counters: shared through Redis when configured.
        self.budgets = Budgets(self.metrics, RedisLedger(self.redis) if self.redis is not None else LocalLedger())
        self.settlements = Settlements(self.accounting, self.limiter, self.metrics, self.shared_cache, self.distill,
                                       self.budgets)
        self.shadow = ShadowChecks(  # cache hits checked against a tier after they were served
            dispatcher=self.dispatcher, metrics=self.metrics, settlements=self.settlements, cache=self.shared_cache,
            draining=self.is_draining, concurrency=settings.cache_shadow_concurrency, hold=self.tiers.hold)
        self.relay = Relay(self.metrics, self.shadow)
        # The learned router (policy `router:`): edge_success before decisions, outcome records, exploration.
        outcomes = OutcomeRecorder(self.redis, self.registry)
        agreements = Agreements(outcomes, self.registry, fallback=self._cache_judge, dispatcher=self.dispatcher,
                                gateway_metrics=self.metrics, hold=self.tiers.hold, draining=self.is_draining)
        self.router = LearnedRouter(self.registry, outcomes, agreements=agreements)
        self.explorations = Explorations(dispatcher=self.dispatcher, router=self.router, draining=self.is_draining,
                                         hold=self.tiers.hold)

    @property
    def cache(self) -> SemanticCache | None:
        """The cache once start-up built it (None when disabled)."""
        return self.shared_cache.current

    def is_draining(self) -> bool:
        return self.draining

    def _cache_judge(self) -> Judge | None:
        """The cache's judge (its embedder, or the operator's model), for long answers the router's labels compare."""
        cache = self.shared_cache.current
        return cache.verifier.judge if cache is not None else None

    async def startup(self) -> None:
        await self.upstream.start()
        await self.policy_store.start()
        self.policy_store.on_change(self._sync_tiers)
        await self._sync_tiers()
        await self.quarantine.start()
        await self.keys.start()
        await self.history.start()
        if self.settings.cache:
            s = self.settings
            judge = HttpJudge(s.cache_judge_url, s.cache_judge_model or "auto", s.cache_judge_key) \
                if s.cache_judge_url else None
            settings = CacheSettings(store=s.cache_store, vset_search_in_script=s.cache_vset_search == "script")
            cache = build_cache(s.redis_url, s.embedder, settings=settings, metrics=CacheMetrics(self.registry),
                                judge=judge, verifier_path=s.cache_verifier)
            self.shared_cache.current = cache
            await cache.start()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_sighup)
        log.info("gateway_started", policy=str(self.settings.policy), redis=bool(self.redis),
                 tiers={n: t.pool.__class__.__name__ for n, t in self.tiers.items()},
                 stand_in=[n for n, t in self.tiers.items() if t.config.stand_in])
        _tune_gc()

    async def shutdown(self) -> None:
        self.draining = True
        await self.shadow.stop()
        await self.explorations.stop()
        if self.router.agreements is not None:
            await self.router.agreements.stop()
        await self.router.outcomes.flush()
        await self.history.stop()
        await self.policy_store.stop()
        await self.quarantine.stop()
        await self.keys.stop()
        await self.tiers.stop()
        if (cache := self.shared_cache.current) is not None:
            await cache.stop()
        await self.upstream.close()
        if self.redis is not None:
            await self.redis.aclose()

    def _on_sighup(self) -> None:
        asyncio.get_running_loop().create_task(self.policy_store.reload())

    async def _sync_tiers(self, active: ActivePolicy | None = None) -> None:
        """Build the pools of a (re)loaded policy; requests move to it once they are all up (`Tiers.sync`). Its
        `throughput: live` prices read the tiers' nodes from then on."""
        active = active or self.policy_store.current
        if active.policy.costs is not None:
            active.policy.costs.read_live_throughput(self.tiers.throughput)
        await self.tiers.sync(active)

    def ready(self) -> tuple[bool, dict[str, object]]:
        tiers = self.tiers.health()
        ok = not self.draining and any(tiers.values())
        return ok, {"ready": ok, "draining": self.draining, "policy": self.tiers.current.version, "tiers": tiers}


def _process_registry() -> CollectorRegistry:
    """A registry of this gateway's own, with the process, platform and GC collectors a scrape expects."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def _tune_gc() -> None:
    """Keep the cyclic garbage collector off the request path's back.

    What start-up loaded (tokenizer vocabularies, the compiled complexity trees, the policy) lives as long as the
    process, so it is frozen out of every later collection, and the youngest generation is collected every 20k
    allocations rather than every 700: every few dozen requests instead of every other one. The effect on the
    latency tail is measured by `bench.overhead.inprocess --gap-ms 5` (docs/benchmarks.md).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


def _keyring_from(settings: Settings) -> KeyRing:
    """The key file, else the inline keys, else the public demo key if allowed, else no key at all (all 401)."""
    if settings.api_keys_file:
        return KeyRing.from_file(settings.api_keys_file)
    if settings.api_keys:
        return KeyRing.from_inline(settings.api_keys)
    if settings.demo_key:
        return KeyRing.demo()
    log.warning("no_api_keys", message="no API keys configured and TIERGATE_DEMO_KEY is false: every request "
                                       "will be refused (set TIERGATE_API_KEYS_FILE or TIERGATE_API_KEYS)")
    return KeyRing({})
