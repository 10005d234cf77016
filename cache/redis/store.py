"""Cache entries in Redis, shared by every gateway process: the store the cache uses.

Two layouts keep the entries (see docs/cache.md):
- `redis-vectorset` (`cache.redis.vset`), on Redis 8: entries and their vectors in Redis, one vector set per
  namespace, searched server-side with `VSIM`. Nothing is loaded at start and no process keeps an index.
- `redis-stream` (`cache.redis.stream`), on a stock Redis 7 (no vector search): entry hashes in Redis, and
  an index in every process, loaded by SCAN at start and kept in step by following a change stream.

The connection, its failures and which layout serves are the link's (`cache.redis.link`); the store runs each
lookup, write and invalidation on the serving layout through it, and says what serves in `describe()`
(/readyz). While Redis is down or slow every call reports `StoreUnavailable` at once (the cache is bypassed).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import numpy as np

from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import tenant_tag
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.redis.conn import AnyRedis, safe_url
from tiergate.cache.redis.layout import Layout
from tiergate.cache.redis.link import RedisLink
from tiergate.cache.settings import CacheSettings
from tiergate.cache.types import CacheEntry

__all__ = ["RedisStore"]

T = TypeVar("T")


class RedisStore:
    """The cache's store on Redis: lookups, writes and invalidations on the layout that serves."""

    in_process = False

    def __init__(self, url: str, index: VectorIndex, settings: CacheSettings, metrics: CacheMetrics) -> None:
        self.link = RedisLink(url, index, settings, metrics)
        self.index = index
        self.url = url
        self.settings = settings

    # -- what serves ----------------------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        layout = self.link.layout
        return layout.kind if layout is not None else "redis"

    @property
    def layout(self) -> Layout | None:
        return self.link.layout

    def describe(self) -> dict[str, object]:
        link = self.link
        out: dict[str, object] = {"store": self.kind, "up": link.up, "url": safe_url(self.url),
                                  "requested": self.settings.store}
        if link.capabilities is not None:
            out["vector_sets"] = link.capabilities.vector_sets
            if link.capabilities.note:
                out["note"] = link.capabilities.note
        if link.problem:
            out["problem"] = link.problem
        if link.layout is not None and (n := link.layout.entries()) is not None:
            out["entries"] = n
        return out

    def available(self) -> bool:
        return self.link.up

    # -- lifecycle (the link's) -------------------------------------------------------------------------------
    async def start(self, wait_s: float = 5.0) -> None:
        await self.link.start(wait_s)

    async def start_admin(self) -> None:
        await self.link.start_admin()

    async def stop(self) -> None:
        await self.link.stop()

    # -- the link, for other shared state kept on the cache's Redis (`cache.shared`) -----------------------
    @property
    def r(self) -> AnyRedis:
        return self.link.r

    @property
    def bg(self) -> AnyRedis:
        return self.link.bg

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await self.link.call(fn)

    async def admin(self, fn: Callable[[], Awaitable[T]]) -> T:
        return await self.link.admin(fn)

    # -- request path ----------------------------------------------------------------------------------------
    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        if not entry_ids:
            return []
        return await self.link.call(lambda: self.link.active().get_many(namespace, entry_ids))

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]:
        return await self.link.call(lambda: self.link.active().nearest(namespace, vector, k, min_sim))

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        return await self.link.call(lambda: self.link.active().put(entry, vector))

    # -- admin (bounded, but not held to the request-path timeout) -------------------------------------------
    async def delete(self, entry_id: str, namespace: str | None = None) -> int:
        return sum([await self.link.admin(functools.partial(lay.delete, entry_id, namespace))
                    for lay in await self._admin_layouts()])

    async def delete_tenant(self, tenant: str) -> int:
        tag = tenant_tag(tenant)
        return sum([await self.link.admin(functools.partial(lay.delete_tenant, tag))
                    for lay in await self._admin_layouts()])

    async def delete_all(self) -> int:
        return sum([await self.link.admin(lay.delete_all) for lay in await self._admin_layouts()])

    async def _admin_layouts(self) -> list[Layout]:
        """The serving layout, and on a server with vector sets also the stream layout's entries if any are
        left (written before an upgrade, or by gateways told to use it): an invalidation reaches both."""
        active = self.link.active()
        out = [active]
        if active.kind != "redis-stream":
            stream = self.link.layout_for("redis-stream")
            if await self.link.admin(stream.has_data):
                out.append(stream)
        return out
