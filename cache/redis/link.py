"""The cache's link to Redis: its two clients, whether Redis is up, reconnecting, and which layout serves.

Which layout serves is decided at every (re)connect from what the server can do (`cache.redis.conn.vector_sets`)
and `CacheSettings.store`: "auto" takes vector sets when the server has them (and this user may run them),
else the stream layout; "vectorset" insists on them (a server without them is logged and the cache is
bypassed until it has them); "stream" keeps the Redis 7 layout everywhere (a mixed fleet during an upgrade).
A Redis Cluster uses the stream layout (see docs/cache.md, "Redis Cluster"). The choice is logged
(`cache_redis_up`, `store=`).

Request-path commands have a short timeout and no retries: when Redis is down or slow `call` reports
`StoreUnavailable` at once (the cache is bypassed) until a background probe sees it answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tiergate.cache.index import VectorIndex
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.redis.conn import AnyRedis, Capabilities, is_cluster, open_redis, safe_url, vector_sets
from tiergate.cache.redis.layout import BLOCK_MS, FAILURES, Layout, Misconfigured
from tiergate.cache.redis.stream import StreamLayout
from tiergate.cache.redis.vset import VectorSetLayout
from tiergate.cache.settings import CacheSettings
from tiergate.cache.store import StoreUnavailable

__all__ = ["RedisLink"]

log = structlog.get_logger("tiergate.cache.redis")
T = TypeVar("T")

_SLOW_STRIKES = 3  # consecutive timeouts that mark a live-but-slow Redis down (refused connections: at once)


class RedisLink:
    """Keeps the cache connected to Redis: runs commands within its timeouts, marks Redis down when they fail,
    reconnects in the background and picks the layout at every connect. It is the `Conn` its layouts use."""

    def __init__(self, url: str, index: VectorIndex, settings: CacheSettings, metrics: CacheMetrics) -> None:
        if settings.store not in ("auto", "vectorset", "stream"):
            raise ValueError(f"cache store {settings.store!r}: choose auto, vectorset or stream")
        self.index = index
        self.url = url
        self.settings = settings
        self.metrics = metrics
        self.cluster = is_cluster(url)
        no_retry = Retry(NoBackoff(), 0)
        t = settings.redis_timeout_s
        # Request path: one short timeout, no retries (a retry is the caller's next request).
        self.r: AnyRedis = open_redis(url, socket_timeout=t, socket_connect_timeout=t, retry=no_retry,
                                      health_check_interval=0, max_connections=256)
        # Background work (stream followers, sweeps, loading, admin): longer timeouts, never on the request path.
        self.bg: AnyRedis = open_redis(url, socket_timeout=BLOCK_MS / 1000 + 5, socket_connect_timeout=2.0,
                                       retry=no_retry, health_check_interval=0,
                                       max_connections=8 + settings.cluster_shards)
        self.up = False
        self.stopping = False
        self.capabilities: Capabilities | None = None
        self.problem: str | None = None  # why the cache is bypassed although Redis answers
        self._layout: Layout | None = None
        self._layouts: dict[str, Layout] = {}
        self._strikes = 0
        self._run_id: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._down = asyncio.Event()

    @property
    def layout(self) -> Layout | None:
        return self._layout

    def active(self) -> Layout:
        """The layout that serves; `StoreUnavailable` while Redis is down or none is chosen yet."""
        if not self.up:
            raise StoreUnavailable(self.problem or "redis is down")
        return self._active_layout()

    def _active_layout(self) -> Layout:
        if self._layout is None:
            raise StoreUnavailable("not connected yet")
        return self._layout

    def layout_for(self, kind: str) -> Layout:
        layout = self._layouts.get(kind)
        if layout is None:
            layout = VectorSetLayout(self) if kind == "redis-vectorset" else StreamLayout(self)
            self._layouts[kind] = layout
        return layout

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self, wait_s: float = 5.0) -> None:
        """Connect (and, on the stream layout, load the index) in the background; wait for the first attempt
        (bounded), so a fresh gateway already hits, and one whose Redis is down starts at once (bypassing)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="tiergate-cache-redis")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._ready.wait()

    async def start_admin(self) -> None:
        """Connect for admin commands only (CLI): pick the layout, no index load, no background work."""
        await self.admin(self._choose)
        self.up = True

    async def stop(self) -> None:
        # Ends the loops even if a cancellation gets lost inside a Redis client call; the timeouts here are
        # `asyncio.timeout`, not `wait_for`, whose 3.11 version can swallow a cancellation that races a result.
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            # Bounded: shutting down must not wait on a Redis client that does not finish cancelling.
            done, _ = await asyncio.wait({self._task}, timeout=5.0)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: it ended as it ends, nothing to report at shutdown
            self._task = None
        for client in (self.r, self.bg):
            with contextlib.suppress(Exception):
                await client.aclose()

    # -- failure handling --------------------------------------------------------------------------------------
    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if not self.up:
            raise StoreUnavailable(self.problem or "redis is down")
        try:
            async with asyncio.timeout(self.settings.redis_timeout_s):
                result = await fn()
        except TimeoutError as exc:
            # One slow answer (a CPU hiccup here or there) bypasses this request only; several in a row
            # mean Redis is in trouble: stop sending it request-path work until the probe sees it answer.
            self._strikes += 1
            if self._strikes >= _SLOW_STRIKES:
                self.mark_down(exc)
            raise StoreUnavailable("redis timed out") from exc
        except FAILURES as exc:
            self.mark_down(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
        self._strikes = 0
        return result

    async def admin(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            async with asyncio.timeout(30.0):
                return await fn()
        except FAILURES as exc:
            self.mark_down(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc

    def mark_down(self, exc: BaseException) -> None:
        if self.up:
            log.warning("cache_redis_down", error=repr(exc), url=safe_url(self.url))
        self.up = False
        self._strikes = 0
        self.metrics.redis_up.set(0)
        self._wake.set()
        self._down.set()

    async def pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._down.wait()

    # -- background: connect, choose, run ----------------------------------------------------------------------
    async def _supervise(self) -> None:
        while not self.stopping:
            try:
                if not self.up:
                    await self._connect()
                await self.active().run()
            except asyncio.CancelledError:
                raise
            except Misconfigured:  # logged where it was found; probed again like a Redis that is down
                self.up = False
                self.metrics.redis_up.set(0)
                self._ready.set()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.retry_every_s):
                        await asyncio.Event().wait()
            except (*FAILURES, StoreUnavailable) as exc:
                self.mark_down(exc)
                self._ready.set()  # the first attempt is over: start() need not wait for a dead Redis
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.settings.retry_every_s):
                        await self._wake.wait()
            except Exception as exc:
                self.metrics.errors.labels("sync").inc()
                log.exception("cache_sync_error", error=repr(exc))
                await asyncio.sleep(self.settings.retry_every_s)

    async def _connect(self) -> None:
        async with asyncio.timeout(5.0):
            run_id = await self._run_ids()
            await self._choose()
            await self._active_layout().prepare()
        # Connections opened before the outage point at a dead socket: drop them, not a request later.
        with contextlib.suppress(Exception):
            if isinstance(self.r, RedisCluster):
                await self.r.aclose()  # and learn the slots again on the next command (a failover moves them)
            else:
                await self.r.connection_pool.disconnect()
        restarted = run_id != self._run_id
        self._down.clear()
        self.up = True
        self.metrics.redis_up.set(1)
        layout = self._active_layout()
        await layout.on_connect(restarted)
        self._run_id = run_id
        for kind in ("redis-stream", "redis-vectorset"):
            self.metrics.store_kind.labels(kind).set(1 if kind == layout.kind else 0)
        log.info("cache_redis_up", url=safe_url(self.url), store=layout.kind, requested=self.settings.store,
                 vector_sets=self.capabilities.vector_sets if self.capabilities else None, restarted=restarted,
                 entries=layout.entries())
        self._ready.set()

    async def _choose(self) -> None:
        """Pick the layout from what this server can do; raise `Misconfigured` when the one asked for is not
        possible (the cache is bypassed, and this is tried again at every probe)."""
        want = self.settings.store
        caps = Capabilities(False, "a Redis Cluster: the stream layout serves (docs/cache.md)") if self.cluster \
            else await vector_sets(self.bg, f"{self.settings.prefix}:probe")
        first = self.capabilities is None or caps != self.capabilities
        self.capabilities = caps
        if want == "vectorset" and not caps.vector_sets:
            self.problem = f"vector sets were asked for (store=vectorset) but are not usable: {caps.note}"
            if first:
                log.error("cache_vector_sets_unavailable", url=safe_url(self.url), reason=caps.note,
                          effect="the cache is bypassed until the server offers them",
                          fix="use Redis 8 (and grant the vector-set commands), or TIERGATE_CACHE_STORE=auto")
            self.metrics.redis_up.set(0)
            raise Misconfigured(self.problem)
        if want == "auto" and not caps.vector_sets and caps.note and first and not self.cluster:
            log.warning("cache_vector_sets_not_used", url=safe_url(self.url), reason=caps.note,
                        effect="the Redis 7 (stream) layout serves: every gateway keeps its own index")
        kind = "redis-vectorset" if caps.vector_sets and want != "stream" else "redis-stream"
        self.problem = None
        if self._layout is not None and self._layout.kind != kind:
            log.warning("cache_store_changed", old=self._layout.kind, new=kind)
            self.index.clear()
        self._layout = self.layout_for(kind)

    async def _run_ids(self) -> str:
        """Who is serving: the run id of the server, or of every Cluster primary. A change means a restart
        (its data may be gone)."""
        if isinstance(self.bg, RedisCluster):
            await self.bg.aclose()  # a node may have failed over or come back: learn the topology anew
            infos = await self.bg.info("server", target_nodes=RedisCluster.PRIMARIES)
            return ",".join(sorted(str(i.get("run_id")) for i in infos.values()))
        info: dict[str, Any] = await self.bg.info("server")
        if info.get("redis_mode") == "cluster":
            if self.problem is None:
                log.error("cache_redis_is_a_cluster", url=safe_url(self.url),
                          fix="this Redis is a Cluster node: use a redis+cluster:// URL (see docs/cache.md)")
            self.problem = f"{safe_url(self.url)} is a Redis Cluster node; use redis+cluster://"
            raise Misconfigured(self.problem)
        return str(info.get("run_id"))
