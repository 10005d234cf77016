"""What the error bound and the feedback endpoint share between gateways: label counts, per-entry thresholds,
and which entry answered which request.

`RedisShared` keeps them in the cache's Redis (plain hashes and strings: any Redis version, one key per
operation, so a Cluster works too); `MemoryShared` in the process, for a gateway without Redis.

Keys (prefix `P`, default "tiergate:cache"):
- `P:eb:{<tenant tag>}:cells`: hash `<row>:<region>:<cell>` -> count (rows: 0 lookups, 1 labelled, 2 wrong);
- `P:eb:th:<entry id>`: an entry's own threshold (it only rises), kept `entry_memory_s`;
- `P:fb:<tenant tag>:<hash of the request id>`: the entry a request was answered from, kept `feedback_ttl_s`
  (keyed by tenant: another tenant's request id is simply not found).

Tested in `tests/cache/test_errbound.py`.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any, Protocol

import msgspec
import numpy as np

from tiergate.cache.errbound import new_counts
from tiergate.cache.keys import tenant_tag
from tiergate.cache.redis.store import RedisStore

__all__ = ["HitRecord", "MemoryShared", "RedisShared", "SharedState", "request_key_hash"]


_TAKE = """
local r = redis.call('HGET', KEYS[1], 'r')
if not r then return false end
return {r, redis.call('HSETNX', KEYS[1], 'reported', 1)}
"""

_RAISE = """
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
local new = tonumber(ARGV[1])
if new > old then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2]) return ARGV[1] end
redis.call('EXPIRE', KEYS[1], ARGV[2])
return tostring(old)
"""


class HitRecord(msgspec.Struct, frozen=True):
    """Which entry answered a request (for `POST /v1/cache/feedback`)."""

    tenant: str
    entry_id: str
    namespace: str
    kind: str  # hit-exact | hit-semantic
    similarity: float
    overlap: float = 1.0  # (records written before the error bound had regions: the top region)


def request_key_hash(request_id: str) -> str:
    return hashlib.sha256(request_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class SharedState(Protocol):
    async def add_counts(self, deltas: dict[str, np.ndarray]) -> None: ...

    async def counts(self, tenants: list[str]) -> dict[str, np.ndarray]: ...

    async def entry_threshold(self, entry_id: str) -> float | None:
        """An entry's own threshold (request path: one short read)."""
        ...

    async def raise_entry_threshold(self, entry_id: str, value: float) -> float: ...

    async def remember_hit(self, request_id: str, record: HitRecord) -> None: ...

    async def hit(self, tenant: str, request_id: str) -> tuple[HitRecord | None, bool]:
        """The tenant's record of a request (None: unknown here), and whether it was reported before (this
        call marks it reported)."""
        ...


class MemoryShared:
    def __init__(self, entry_memory_s: float, feedback_ttl_s: float, max_items: int = 100_000) -> None:
        self._counts: dict[str, np.ndarray] = {}
        self._thresholds: dict[str, tuple[float, float]] = {}  # entry id -> (threshold, expires)
        self._hits: dict[str, tuple[HitRecord, float, bool]] = {}  # key -> (record, expires, reported)
        self._entry_memory_s = entry_memory_s
        self._feedback_ttl_s = feedback_ttl_s
        self._max = max_items

    async def add_counts(self, deltas: dict[str, np.ndarray]) -> None:
        for tenant, d in deltas.items():
            cur = self._counts.get(tenant)
            self._counts[tenant] = d.copy() if cur is None else cur + d

    async def counts(self, tenants: list[str]) -> dict[str, np.ndarray]:
        return {t: self._counts[t].copy() for t in tenants if t in self._counts}

    async def entry_threshold(self, entry_id: str) -> float | None:
        got = self._thresholds.get(entry_id)
        if got is None or got[1] <= time.time():
            return None
        return got[0]

    async def raise_entry_threshold(self, entry_id: str, value: float) -> float:
        old = await self.entry_threshold(entry_id) or 0.0
        new = max(old, value)
        self._thresholds[entry_id] = (new, time.time() + self._entry_memory_s)
        self._trim(self._thresholds)
        return new

    async def remember_hit(self, request_id: str, record: HitRecord) -> None:
        self._hits[_hit_key(record.tenant, request_id)] = (record, time.time() + self._feedback_ttl_s, False)
        self._trim(self._hits)

    async def hit(self, tenant: str, request_id: str) -> tuple[HitRecord | None, bool]:
        key = _hit_key(tenant, request_id)
        got = self._hits.get(key)
        if got is None or got[1] <= time.time():
            return None, False
        record, expires, reported = got
        self._hits[key] = (record, expires, True)
        return record, reported

    def _trim(self, d: dict[str, Any]) -> None:
        while len(d) > self._max:
            d.pop(next(iter(d)))


class RedisShared:
    """On the cache's Redis, through its store's connections and failure handling (`StoreUnavailable`)."""

    def __init__(self, store: RedisStore) -> None:
        self._s = store
        p = store.settings.prefix
        self._p = p
        self._raise = store.bg.register_script(_RAISE)
        self._take = store.bg.register_script(_TAKE)

    def _cells_key(self, tenant: str) -> str:
        return f"{self._p}:eb:{{{tenant_tag(tenant)}}}:cells"

    async def add_counts(self, deltas: dict[str, np.ndarray]) -> None:
        async def run() -> None:
            async with self._s.bg.pipeline(transaction=False) as pipe:
                for tenant, d in deltas.items():  # plain commands: a Cluster pipeline cannot carry scripts
                    for r, g, c in zip(*(x.tolist() for x in np.nonzero(d)), strict=True):
                        pipe.hincrby(self._cells_key(tenant), f"{r}:{g}:{c}", int(d[r, g, c]))
                await pipe.execute()

        await self._s.admin(run)

    async def counts(self, tenants: list[str]) -> dict[str, np.ndarray]:
        async def run() -> list[dict[bytes, bytes]]:
            async with self._s.bg.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(self._cells_key(tenant))
                return await pipe.execute()

        out: dict[str, np.ndarray] = {}
        # The request path's timeout: a gateway reads a tenant's counts on its first bounded lookup (`ensure`).
        for tenant, row in zip(tenants, await self._s.call(run), strict=True):
            if not row:
                continue
            counts = new_counts()
            for field, value in row.items():
                # "row:region:cell"; anything else is skipped: a malformed field, or a "row:cell" one written
                # before the counts had regions (that evidence is not read again)
                with contextlib.suppress(ValueError):
                    r, g, c = (int(x) for x in field.split(b":"))
                    if all(0 <= i < n for i, n in zip((r, g, c), counts.shape, strict=True)):
                        counts[r, g, c] = int(value)
            out[tenant] = counts
        return out

    async def entry_threshold(self, entry_id: str) -> float | None:
        got = await self._s.call(lambda: self._s.r.get(f"{self._p}:eb:th:{entry_id}"))
        try:
            return float(got) if got is not None else None
        except ValueError:
            return 1.0  # unreadable: serve nothing from this entry rather than guess

    async def raise_entry_threshold(self, entry_id: str, value: float) -> float:
        ttl = int(self._s.settings.entry_memory_s)
        got = await self._s.admin(lambda: self._raise(keys=[f"{self._p}:eb:th:{entry_id}"], args=[repr(value), ttl]))
        return float(got)

    async def remember_hit(self, request_id: str, record: HitRecord) -> None:
        key = self._hit_key(record.tenant, request_id)

        async def run() -> None:
            async with self._s.bg.pipeline(transaction=False) as pipe:
                pipe.hset(key, mapping={"r": msgspec.json.encode(record)})
                pipe.expire(key, int(self._s.settings.feedback_ttl_s))
                await pipe.execute()

        await self._s.admin(run)

    async def hit(self, tenant: str, request_id: str) -> tuple[HitRecord | None, bool]:
        key = self._hit_key(tenant, request_id)

        got = await self._s.admin(lambda: self._take(keys=[key]))
        if not got:
            return None, False
        raw, first = got
        try:
            record = msgspec.json.decode(raw, type=HitRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None, False
        return (record, not first) if record.tenant == tenant else (None, False)

    def _hit_key(self, tenant: str, request_id: str) -> str:
        return _hit_key(tenant, request_id, f"{self._p}:fb:")


def _hit_key(tenant: str, request_id: str, prefix: str = "") -> str:
    return f"{prefix}{tenant_tag(tenant)}:{request_key_hash(request_id)}"
