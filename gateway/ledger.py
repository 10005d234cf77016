"""Where spend lives: budget counters and daily spend records, in Redis (shared by every replica) or in process.

Two kinds of entry, all of a tenant's under one hash tag (`{tenant}`), so a Cluster keeps them on one node:

- a **budget counter** per budget and period: an integer in billionths of the currency (`NANO`), the spend
  settled so far plus the reservations of requests still running. `reserve` checks every counter a request is
  under and takes its worst case from all of them in one Lua step, so concurrent requests on any replica cannot
  all pass a limit that only some of them fit, and a refusal takes nothing; `settle` corrects the reservation by
  the difference to what the request really cost. A counter expires a day after its period ends.
- a **daily spend record**: one hash per tenant and UTC day, with fields per tier, rule and kind, and per key
  (cost, requests, tokens); bounded by the policy's tiers and rules and the tenant's keys, kept
  `retention_days`.

Tested in `tests/gateway/test_ledger.py` and, against real Redis, `tests/integration/test_budgets_redis.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tiergate.cache.redis.conn import AnyRedis

__all__ = ["NANO", "Counter", "Ledger", "LocalLedger", "RedisLedger", "counter_key", "day_key"]

NANO = 1_000_000_000  # budget counters are integers in billionths of the currency: exact, and Lua-safe to 9e6 units

# KEYS: the counters. ARGV: the amount, then per counter its hard limit (-1: none) and TTL.
# Returns {0, 0} when every counter took the amount, else {i, value of counter i} for the first that refused.
_RESERVE = """
local amount = tonumber(ARGV[1])
for i = 1, #KEYS do
  local limit = tonumber(ARGV[2 * i])
  if limit >= 0 then
    local cur = tonumber(redis.call('GET', KEYS[i]) or '0')
    if cur + amount > limit then
      return {i, cur}
    end
  end
end
for i = 1, #KEYS do
  redis.call('INCRBY', KEYS[i], amount)
  redis.call('EXPIRE', KEYS[i], tonumber(ARGV[2 * i + 1]))
end
return {0, 0}
"""


def counter_key(prefix: str, tenant: str, scope: str, period_id: str) -> str:
    """A budget counter: `scope` is `tenant` or `key:<key id>`."""
    return f"{prefix}:{{{tenant}}}:budget:{scope}:{period_id}"


def day_key(prefix: str, tenant: str, day: str) -> str:
    """A tenant's spend record for one UTC day (`YYYY-MM-DD`)."""
    return f"{prefix}:{{{tenant}}}:day:{day}"


@dataclass(frozen=True, slots=True)
class Counter:
    """A budget counter a request is checked against: its key, its hard limit in `NANO` (None: alert only) and
    how long it lives (until a day after its period ends)."""

    key: str
    hard: int | None
    ttl_s: int


class Ledger(Protocol):
    shared: bool  # in Redis (calls can fail or hang), or in this process

    async def reserve(self, counters: Sequence[Counter], amount: int) -> tuple[int, int] | None:
        """Take `amount` from every counter, or from none: None when taken, else (index, value) of the first
        counter it did not fit."""
        ...

    async def settle(self, counters: Sequence[Counter], delta: int, day: str, fields: Mapping[str, float],
                     ttl_s: int) -> list[int]:
        """Add `delta` to the counters (their values after it, in order) and `fields` to the day's record."""
        ...

    async def read(self, counters: Sequence[str], days: Sequence[str], fields: Sequence[str]) -> tuple[
            list[int], list[float]]:
        """The counters' values and, summed over `days` (record keys), the `fields`."""
        ...


class LocalLedger:
    """The ledger in this process (no Redis): each replica counts on its own."""

    shared = False

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._counters: dict[str, tuple[int, float]] = {}  # key -> (value, expires at)
        self._days: dict[str, tuple[dict[str, float], float]] = {}
        self._writes = 0

    def _value(self, key: str) -> int:
        got = self._counters.get(key)
        return 0 if got is None or got[1] <= self._clock() else got[0]

    async def reserve(self, counters: Sequence[Counter], amount: int) -> tuple[int, int] | None:
        for i, c in enumerate(counters):
            cur = self._value(c.key)
            if c.hard is not None and cur + amount > c.hard:
                return i, cur
        now = self._clock()
        for c in counters:
            self._counters[c.key] = (self._value(c.key) + amount, now + c.ttl_s)
        self._prune()
        return None

    async def settle(self, counters: Sequence[Counter], delta: int, day: str, fields: Mapping[str, float],
                     ttl_s: int) -> list[int]:
        now = self._clock()
        out = []
        for c in counters:
            value = self._value(c.key) + delta
            self._counters[c.key] = (value, now + c.ttl_s)
            out.append(value)
        if fields:
            record = self._days.get(day)
            values = record[0] if record is not None and record[1] > now else {}
            for name, amount in fields.items():
                values[name] = values.get(name, 0.0) + amount
            self._days[day] = (values, now + ttl_s)
        self._prune()
        return out

    async def read(self, counters: Sequence[str], days: Sequence[str], fields: Sequence[str]) -> tuple[
            list[int], list[float]]:
        now = self._clock()
        sums = [0.0] * len(fields)
        for day in days:
            record = self._days.get(day)
            if record is None or record[1] <= now:
                continue
            for i, name in enumerate(fields):
                sums[i] += record[0].get(name, 0.0)
        return [self._value(k) for k in counters], sums

    def _prune(self) -> None:
        self._writes += 1
        if self._writes % 1000:
            return
        now = self._clock()
        for k in [k for k, (_, exp) in self._counters.items() if exp <= now]:
            del self._counters[k]
        for k in [k for k, (_, exp) in self._days.items() if exp <= now]:
            del self._days[k]


class RedisLedger:
    """The ledger in Redis, shared by every replica (one server or a Cluster)."""

    shared = True

    def __init__(self, redis: AnyRedis) -> None:
        self._redis = redis
        self._script = redis.register_script(_RESERVE)
        self._first = asyncio.Lock()
        self._loaded = False

    async def reserve(self, counters: Sequence[Counter], amount: int) -> tuple[int, int] | None:
        args: list[int] = [amount]
        for c in counters:
            args += [-1 if c.hard is None else c.hard, c.ttl_s]
        keys = [c.key for c in counters]
        if self._loaded:
            index, value = await self._script(keys=keys, args=args)
        else:  # a Cluster client's very first commands must not be concurrent script calls (see rate_window)
            async with self._first:
                index, value = await self._script(keys=keys, args=args)
                self._loaded = True
        return None if int(index) == 0 else (int(index) - 1, int(value))

    async def settle(self, counters: Sequence[Counter], delta: int, day: str, fields: Mapping[str, float],
                     ttl_s: int) -> list[int]:
        pipe = self._redis.pipeline(transaction=False)
        for c in counters:
            pipe.incrby(c.key, delta)
            pipe.expire(c.key, c.ttl_s)
        for name, amount in fields.items():
            pipe.hincrbyfloat(day, name, amount)
        if fields:
            pipe.expire(day, ttl_s)
        done = await pipe.execute()
        return [int(done[2 * i]) for i in range(len(counters))]

    async def read(self, counters: Sequence[str], days: Sequence[str], fields: Sequence[str]) -> tuple[
            list[int], list[float]]:
        pipe = self._redis.pipeline(transaction=False)
        for k in counters:
            pipe.get(k)
        for day in days:
            pipe.hmget(day, list(fields))
        done = await pipe.execute()
        values = [int(v or 0) for v in done[:len(counters)]]
        sums = [0.0] * len(fields)
        for row in done[len(counters):]:
            for i, v in enumerate(row):
                if v is not None:
                    sums[i] += float(v)
        return values, sums
