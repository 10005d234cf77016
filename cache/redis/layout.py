"""What a Redis layout of the cache is, and what it may use of the link that runs it (`cache.redis.link`).

A layout (`cache.redis.stream` for Redis 7, `cache.redis.vset` for Redis 8) says where entries and vectors live
and how they are searched. The link owns the connections, the timeouts and the up/down state, and the store
(`cache.redis.store`) calls the layout inside them: a layout method just talks to Redis and lets failures
propagate.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

import numpy as np
from redis.exceptions import RedisClusterException, RedisError

from tiergate.cache.index import VectorIndex
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.redis.conn import AnyRedis
from tiergate.cache.settings import CacheSettings
from tiergate.cache.types import CacheEntry

__all__ = ["BLOCK_MS", "FAILURES", "Conn", "Layout", "Misconfigured"]

# RedisClusterException (no slot map, slot not covered) is not a RedisError, but it is Redis failing all the same.
FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError, asyncio.TimeoutError)
BLOCK_MS = 250  # stream poll: also how soon the follower notices that a request saw Redis fail


class Misconfigured(RedisError):
    """Redis answers, but not in a way this gateway can use (logged once; the cache is bypassed meanwhile)."""


class Conn(Protocol):
    """The part of the link a layout uses."""

    url: str
    r: AnyRedis  # request path: short timeouts
    bg: AnyRedis  # background and admin work
    index: VectorIndex
    settings: CacheSettings
    metrics: CacheMetrics
    cluster: bool

    @property
    def up(self) -> bool: ...

    @property
    def stopping(self) -> bool: ...

    async def pause(self, seconds: float) -> None:
        """Sleep, but wake as soon as Redis is seen to fail (the link then reconnects)."""
        ...


class Layout(Protocol):
    """How entries are laid out in Redis."""

    kind: str  # "redis-stream" | "redis-vectorset"

    async def prepare(self) -> None:
        """Checks before the link is marked up (raise `Misconfigured` to keep the cache bypassed)."""
        ...

    async def on_connect(self, restarted: bool) -> None:
        """Once Redis answers again (`restarted`: a new server run id, so its data may be gone)."""
        ...

    async def run(self) -> None:
        """Background work while Redis is up (follow a stream, sweep expired entries); returns when it is not."""
        ...

    def entries(self) -> int | None:
        """How many entries it holds, when known without asking Redis."""
        ...

    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]: ...

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]: ...

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        """Store (replace) an entry; returns how many entries the size bound evicted."""
        ...

    async def delete(self, entry_id: str, namespace: str | None) -> int: ...

    async def delete_tenant(self, tag: str) -> int: ...

    async def delete_all(self) -> int: ...

    async def has_data(self) -> bool:
        """Whether any entry of this layout is in Redis (an invalidation then reaches it too)."""
        ...
