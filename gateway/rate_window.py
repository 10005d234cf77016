"""Sliding-window counters behind the per-tenant limits: two fixed one-minute buckets, the previous one weighted by
how much of it the window still overlaps (what most API gateways do: O(1) memory per counter, accurate to a few
percent).

A check and its increment are one step, so concurrent requests cannot all pass a check that only some of them fit,
and a refusal adds nothing: a Lua script in Redis (one server or a Cluster: a counter's buckets share a hash tag),
shared by every gateway replica, or plain arithmetic in process without Redis. The waits a refusal reports come from
the same formula the check uses, so a client that waits `retry_after_s` is admitted, were nothing else taken.

Tested in `tests/gateway/test_rate_window.py` and, against real Redis, `tests/integration/test_limits_redis.py`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from tiergate.cache.redis.conn import AnyRedis

__all__ = ["WINDOW_S", "Counters", "LocalCounters", "RedisCounters", "Take", "reset_s", "retry_after_s"]

WINDOW_S = 60.0
_TTL_S = int(2 * WINDOW_S) + 1  # a bucket is read for two windows: as the current one, then as the previous

# KEYS: the current bucket, the previous one. ARGV: the previous bucket's weight, the limit, the amount, the TTL.
# Returns {admitted (0/1), current count (after the amount when admitted), previous count}.
_TAKE = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local prev = tonumber(redis.call('GET', KEYS[2]) or '0')
local amount = tonumber(ARGV[3])
if cur + prev * tonumber(ARGV[1]) + amount > tonumber(ARGV[2]) then
  return {0, cur, prev}
end
if amount > 0 then
  redis.call('INCRBY', KEYS[1], amount)
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[4]))
end
return {1, cur + amount, prev}
"""


@dataclass(frozen=True, slots=True)
class Take:
    """The outcome of taking `amount` from a counter: admitted or not, and the window as it stands after it."""

    ok: bool
    limit: int
    used: float  # the window's estimate: after the amount when admitted, without it when refused
    retry_after_s: float  # 0 when admitted; else until the amount would fit, were nothing else taken (inf: never)
    reset_s: float  # until the window is empty again, were nothing else taken
    bucket: int  # the bucket the amount went to: a later `adjust` corrects that one

    @property
    def remaining(self) -> int:
        return max(0, math.floor(self.limit - self.used))


def retry_after_s(cur: float, prev: float, offset_s: float, limit: float, amount: float) -> float:
    """Seconds until `cur + prev·w(t) + amount ≤ limit`, w falling from 1 to 0 over the current bucket, then the
    current bucket becoming the previous one. `offset_s`: how far into the current bucket now is."""
    if amount > limit:
        return math.inf
    if cur + amount <= limit:
        if prev <= 0:
            return 0.0
        fits_at = WINDOW_S * (1 - (limit - amount - cur) / prev)  # offset into this bucket where it fits
        return max(0.0, fits_at - offset_s)
    into_next = WINDOW_S * (1 - (limit - amount) / cur)  # this bucket, weighted, in the next one
    return (WINDOW_S - offset_s) + max(0.0, into_next)


def reset_s(cur: float, prev: float, offset_s: float) -> float:
    """Seconds until nothing is counted any more, were nothing else taken."""
    if cur > 0:
        return 2 * WINDOW_S - offset_s
    return WINDOW_S - offset_s if prev > 0 else 0.0


class Counters(Protocol):
    """Where the buckets live."""

    async def take(self, key: str, limit: int, amount: int) -> Take: ...

    async def adjust(self, key: str, bucket: int, delta: int) -> None: ...


def _take(cur: float, prev: float, ok: bool, limit: int, amount: int, now: float) -> Take:
    offset = now % WINDOW_S
    w = 1 - offset / WINDOW_S
    used = cur + prev * w
    wait = 0.0 if ok else retry_after_s(cur, prev, offset, limit, amount)
    return Take(ok, limit, used, wait, reset_s(cur, prev, offset), int(now // WINDOW_S))


class LocalCounters:
    """Buckets in this process (no Redis): each replica counts on its own."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._counts: dict[tuple[str, int], int] = {}

    async def take(self, key: str, limit: int, amount: int) -> Take:
        now = self._clock()
        bucket = int(now // WINDOW_S)
        cur, prev = self._counts.get((key, bucket), 0), self._counts.get((key, bucket - 1), 0)
        ok = cur + prev * (1 - (now % WINDOW_S) / WINDOW_S) + amount <= limit
        if ok and amount:
            cur = self._counts[(key, bucket)] = cur + amount
            if len(self._counts) > 10_000:
                self._prune(bucket - 1)
        return _take(cur, prev, ok, limit, amount, now)

    async def adjust(self, key: str, bucket: int, delta: int) -> None:
        if (key, bucket) in self._counts:  # an older bucket no longer counts: nothing to correct
            self._counts[(key, bucket)] = max(0, self._counts[(key, bucket)] + delta)

    def _prune(self, keep_from: int) -> None:
        for k in [k for k in self._counts if k[1] < keep_from]:
            del self._counts[k]


class RedisCounters:
    """Buckets in Redis, shared by every replica; `key`s are hash-tagged by the caller's `prefix:{tenant}`."""

    def __init__(self, redis: AnyRedis, clock: Callable[[], float]) -> None:
        self._redis = redis
        self._clock = clock
        self._script = redis.register_script(_TAKE)
        self._first = asyncio.Lock()
        self._loaded = False

    async def take(self, key: str, limit: int, amount: int) -> Take:
        now = self._clock()
        bucket = int(now // WINDOW_S)
        w = 1 - (now % WINDOW_S) / WINDOW_S
        keys = [f"{key}:{bucket}", f"{key}:{bucket - 1}"]
        args: list[str | int] = [repr(w), limit, amount, _TTL_S]
        if self._loaded:
            ok, cur, prev = await self._script(keys=keys, args=args)
        else:
            # redis-py's Cluster client breaks when its very first commands are concurrent script calls
            # (`'NoneType' object has no attribute 'writelines'`): the first call runs alone.
            async with self._first:
                ok, cur, prev = await self._script(keys=keys, args=args)
                self._loaded = True
        return _take(int(cur), int(prev), bool(ok), limit, amount, now)

    async def adjust(self, key: str, bucket: int, delta: int) -> None:
        if bucket < int(self._clock() // WINDOW_S) - 1:
            return  # no longer counted by any window
        pipe = self._redis.pipeline(transaction=False)
        pipe.incrby(f"{key}:{bucket}", delta)
        pipe.expire(f"{key}:{bucket}", _TTL_S)
        await pipe.execute()
