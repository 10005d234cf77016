"""Cache entries in a stock Redis 7 (no modules), shared by every gateway process.

Layout (prefix `P`, default "tiergate:cache"):
- `P:e:<entry id>`: a hash per entry (tenant, namespace, text, answer JSON, float32 embedding bytes,
  budget, times) with a TTL. The entry id starts with a hash of the tenant, so a tenant's keys are
  found by pattern and an exact lookup is one HGETALL.
- `P:z`: sorted set of entry ids by expiry time, for the size bound (soonest-expiring evicted first).
- `P:ev`: a stream of index changes (put with the vector, del, tenant, all). Debian's Redis has no vector
  search, so each process keeps its own nearest-neighbour index: it loads it with SCAN at start, then
  follows this stream. After a Redis restart (new run id) or a gap (stream trimmed past the last event
  read), it reloads from scratch.

A put is one Lua script (write, expiry, size bound, events) so concurrent gateways cannot overshoot the
bound or miss an eviction event. Request-path commands have a short timeout and no retries: when Redis is
down or slow the store reports `StoreUnavailable` at once (the cache is bypassed) until a background probe
sees it answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import numpy as np
import structlog
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from cache.index import VectorIndex
from cache.keys import tenant_tag
from cache.metrics import CacheMetrics
from cache.settings import CacheSettings
from cache.store import StoreUnavailable
from cache.types import CachedAnswer, CacheEntry

__all__ = ["RedisStore"]

log = structlog.get_logger("tiergate.cache.redis")
T = TypeVar("T")

_FAILURES = (RedisError, OSError, TimeoutError, asyncio.TimeoutError)
_BLOCK_MS = 250  # stream poll: also how soon the follower notices that a request saw Redis fail
_SLOW_STRIKES = 3  # consecutive timeouts that mark a live-but-slow Redis down (refused connections: at once)
_SCAN_BATCH = 1000

_PUT = """
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'op', 'put', 'id', ARGV[1], 'ns', ARGV[8],
           'tt', ARGV[9], 'v', ARGV[10], 'e', ARGV[3], 'o', ARGV[7])
local t = redis.call('TIME')
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', t[1])
local evicted = 0
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if excess > 0 then
  local popped = redis.call('ZPOPMIN', KEYS[2], excess)
  for i = 1, #popped, 2 do
    redis.call('DEL', ARGV[6] .. ':e:' .. popped[i])
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'op', 'del', 'id', popped[i], 'o', '')
    evicted = evicted + 1
  end
end
return evicted
"""

_DELETE = """
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'op', 'del', 'id', ARGV[1], 'o', '')
return n
"""

_answer_decoder = msgspec.json.Decoder(CachedAnswer)


class RedisStore:
    def __init__(self, url: str, index: VectorIndex, settings: CacheSettings, metrics: CacheMetrics) -> None:
        self.index = index
        self.url = url
        self._s = settings
        self._m = metrics
        self._p = settings.prefix
        self._zset = f"{self._p}:z"
        self._stream = f"{self._p}:ev"
        no_retry = Retry(NoBackoff(), 0)
        t = settings.redis_timeout_s
        # Request path: one short timeout, no retries (a retry is the caller's next request).
        self._r = Redis.from_url(url, socket_timeout=t, socket_connect_timeout=t, retry=no_retry,
                                 health_check_interval=0, max_connections=256)
        # Background work (stream follower, loading, admin): longer timeouts, never on the request path.
        self._bg = Redis.from_url(url, socket_timeout=_BLOCK_MS / 1000 + 5, socket_connect_timeout=2.0,
                                  retry=no_retry, health_check_interval=0, max_connections=8)
        self._put_script = self._r.register_script(_PUT)
        self._delete_script = self._bg.register_script(_DELETE)
        self._origin = uuid.uuid4().hex
        self._up = False
        self._strikes = 0
        self._run_id: str | None = None
        self._last_event = b"0-0"
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait_s: float = 5.0) -> None:
        """Connect and load the index in the background; wait for the first attempt (bounded), so a fresh
        gateway already hits, and a gateway whose Redis is down starts at once (bypassing the cache)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="tiergate-cache-redis")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), wait_s)

    async def start_admin(self) -> None:
        """Connect for admin commands only (CLI): no index load, no stream following."""
        await self._admin(lambda: self._bg.ping())
        self._up = True

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        for client in (self._r, self._bg):
            with contextlib.suppress(Exception):
                await client.aclose()

    def available(self) -> bool:
        return self._up

    # -- request path -----------------------------------------------------------------------------------
    async def get_many(self, entry_ids: list[str]) -> list[CacheEntry | None]:
        if not entry_ids:
            return []

        async def run() -> list[Any]:
            async with self._r.pipeline(transaction=False) as pipe:
                for eid in entry_ids:
                    pipe.hgetall(self._key(eid))
                return await pipe.execute()

        rows = await self._call(run)
        out: list[CacheEntry | None] = []
        for eid, row in zip(entry_ids, rows, strict=True):
            entry = self._decode(eid, row) if row else None
            if entry is None and eid in self.index:
                self.index.remove(eid)  # expired or evicted while our index still had it
            out.append(entry)
        return out

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        ttl_ms = max(int((entry.expires_at - time.time()) * 1000), 1)
        vec = b"" if vector is None else np.asarray(vector, "<f4").tobytes()
        fields: list[Any] = [
            "t", entry.tenant, "ns", entry.namespace, "x", entry.text, "a", msgspec.json.encode(entry.answer),
            "v", vec, "m", "" if entry.max_tokens is None else str(entry.max_tokens),
            "c", repr(entry.created), "e", repr(entry.expires_at),
        ]
        args = [entry.id, ttl_ms, repr(entry.expires_at), self._s.max_entries, self._s.stream_maxlen, self._p,
                self._origin, entry.namespace, tenant_tag(entry.tenant), vec, *fields]
        evicted = await self._call(
            lambda: self._put_script(keys=[self._key(entry.id), self._zset, self._stream], args=args))
        if vector is not None:
            self.index.upsert(entry.id, entry.namespace, tenant_tag(entry.tenant), vector, entry.expires_at)
        else:
            self.index.remove(entry.id)
        return int(evicted)

    # -- admin (bounded, but not held to the request-path timeout) ------------------------------------
    async def delete(self, entry_id: str) -> int:
        n = await self._admin(lambda: self._delete_script(
            keys=[self._key(entry_id), self._zset, self._stream], args=[entry_id, self._s.stream_maxlen]))
        self.index.remove(entry_id)
        return int(n)

    async def delete_tenant(self, tenant: str) -> int:
        tag = tenant_tag(tenant)
        n = await self._admin(lambda: self._delete_matching(f"{self._p}:e:{tag}-*"))
        await self._admin(lambda: self._event({"op": "tenant", "tt": tag}))
        self.index.remove_tenant(tag)
        return n

    async def delete_all(self) -> int:
        n = await self._admin(lambda: self._delete_matching(f"{self._p}:e:*"))
        await self._admin(lambda: self._bg.delete(self._zset))
        await self._admin(lambda: self._event({"op": "all"}))
        self.index.clear()
        return n

    async def _delete_matching(self, pattern: str) -> int:
        deleted = 0
        batch: list[bytes] = []
        async for key in self._bg.scan_iter(match=pattern, count=_SCAN_BATCH):
            batch.append(key)
            if len(batch) >= _SCAN_BATCH:
                deleted += await self._delete_keys(batch)
                batch = []
        if batch:
            deleted += await self._delete_keys(batch)
        return deleted

    async def _delete_keys(self, keys: list[bytes]) -> int:
        ids = [k.decode().rsplit(":", 1)[1] for k in keys]
        async with self._bg.pipeline(transaction=False) as pipe:
            pipe.delete(*keys)
            pipe.zrem(self._zset, *ids)
            n, _ = await pipe.execute()
        return int(n)

    async def _event(self, fields: dict[str, str]) -> None:
        await self._bg.xadd(self._stream, {**fields, "o": ""}, maxlen=self._s.stream_maxlen, approximate=True)

    # -- failure handling -------------------------------------------------------------------------------
    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if not self._up:
            raise StoreUnavailable("redis is down")
        try:
            result = await asyncio.wait_for(fn(), self._s.redis_timeout_s)
        except TimeoutError as exc:
            # One slow answer (a CPU hiccup here or there) bypasses this request only; several in a row
            # mean Redis is in trouble: stop sending it request-path work until the probe sees it answer.
            self._strikes += 1
            if self._strikes >= _SLOW_STRIKES:
                self._mark_down(exc)
            raise StoreUnavailable("redis timed out") from exc
        except _FAILURES as exc:
            self._mark_down(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc
        self._strikes = 0
        return result

    async def _admin(self, fn: Callable[[], Awaitable[T]]) -> T:
        try:
            return await asyncio.wait_for(fn(), 30.0)
        except _FAILURES as exc:
            self._mark_down(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc

    def _mark_down(self, exc: BaseException) -> None:
        if self._up:
            log.warning("cache_redis_down", error=repr(exc), url=_safe(self.url))
        self._up = False
        self._strikes = 0
        self._m.redis_up.set(0)
        self._wake.set()

    # -- background: connect, load, follow ----------------------------------------------------------------
    async def _supervise(self) -> None:
        while True:
            try:
                if not self._up:
                    await self._connect()
                await self._follow()
            except asyncio.CancelledError:
                raise
            except _FAILURES as exc:
                self._mark_down(exc)
                self._ready.set()  # the first attempt is over: start() need not wait for a dead Redis
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._s.retry_every_s)
            except Exception as exc:
                self._m.errors.labels("sync").inc()
                log.exception("cache_sync_error", error=repr(exc))
                await asyncio.sleep(self._s.retry_every_s)

    async def _connect(self) -> None:
        info = await asyncio.wait_for(self._bg.info("server"), 5.0)
        run_id = str(info.get("run_id"))
        needs_reload = run_id != self._run_id or await self._gap()
        # Connections opened before the outage point at a dead socket: drop them, not a request later.
        with contextlib.suppress(Exception):
            await self._r.connection_pool.disconnect()
        self._up = True
        self._m.redis_up.set(1)
        if needs_reload:
            await self._reload()
            self._run_id = run_id
        log.info("cache_redis_up", url=_safe(self.url), reloaded=needs_reload, entries=len(self.index))
        self._ready.set()

    async def _gap(self) -> bool:
        """True when the last event we read is no longer in the stream: we may have missed some after it.

        The stream is trimmed only at its old end, so this means we fell `stream_maxlen` events behind.
        """
        first = await self._bg.xrange(self._stream, count=1)
        return bool(first) and _id_lt(self._last_event, first[0][0])

    async def _reload(self) -> None:
        last = await self._bg.xrevrange(self._stream, count=1)
        self._last_event = last[0][0] if last else b"0-0"
        self.index.clear()
        self._m.resyncs.inc()
        batch: list[bytes] = []
        async for key in self._bg.scan_iter(match=f"{self._p}:e:*", count=_SCAN_BATCH):
            batch.append(key)
            if len(batch) >= _SCAN_BATCH:
                await self._load_keys(batch)
                batch = []
        if batch:
            await self._load_keys(batch)
        self._m.entries.set(len(self.index))

    async def _load_keys(self, keys: list[bytes]) -> None:
        async with self._bg.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hmget(k, "ns", "v", "e")
            rows = await pipe.execute()
        ids, nss, tags, vecs, exps = [], [], [], [], []
        for k, (ns, v, e) in zip(keys, rows, strict=True):
            if not ns or not v or not e or len(v) != 4 * self.index.dim:
                continue
            eid = k.decode().rsplit(":", 1)[1]
            ids.append(eid)
            nss.append(ns.decode())
            tags.append(eid.split("-", 1)[0])
            vecs.append(np.frombuffer(v, "<f4"))
            exps.append(float(e))
        if ids:
            self.index.upsert_many(ids, nss, tags, np.stack(vecs), exps)

    async def _follow(self) -> None:
        while self._up:
            resp = await self._bg.xread({self._stream: self._last_event}, count=500, block=_BLOCK_MS)
            for _stream, events in resp or ():
                for event_id, fields in events:
                    self._apply(fields)
                    self._last_event = event_id
            self._m.entries.set(len(self.index))

    def _apply(self, f: dict[bytes, bytes]) -> None:
        op = f.get(b"op")
        if f.get(b"o") == self._origin.encode():
            return  # our own put, applied when we made it
        if op == b"put":
            v = f.get(b"v", b"")
            if len(v) == 4 * self.index.dim:
                self.index.upsert(f[b"id"].decode(), f[b"ns"].decode(), f[b"tt"].decode(),
                                  np.frombuffer(v, "<f4"), float(f[b"e"]))
            else:
                self.index.remove(f[b"id"].decode())
        elif op == b"del":
            self.index.remove(f[b"id"].decode())
        elif op == b"tenant":
            self.index.remove_tenant(f[b"tt"].decode())
        elif op == b"all":
            self.index.clear()

    # -- encoding ------------------------------------------------------------------------------------------
    def _key(self, entry_id: str) -> str:
        return f"{self._p}:e:{entry_id}"

    def _decode(self, entry_id: str, row: dict[bytes, bytes]) -> CacheEntry | None:
        try:
            m = row.get(b"m") or b""
            return CacheEntry(
                id=entry_id,
                tenant=row[b"t"].decode(),
                namespace=row[b"ns"].decode(),
                text=row[b"x"].decode(),
                answer=_answer_decoder.decode(row[b"a"]),
                embedding=row.get(b"v") or b"",
                max_tokens=int(m) if m else None,
                created=float(row.get(b"c") or 0),
                expires_at=float(row.get(b"e") or 0),
            )
        except (KeyError, ValueError, UnicodeDecodeError, msgspec.DecodeError, msgspec.ValidationError):
            self._m.errors.labels("decode").inc()
            return None


def _id_lt(a: bytes, b: bytes) -> bool:
    ams, aseq = (int(x) for x in a.split(b"-"))
    bms, bseq = (int(x) for x in b.split(b"-"))
    return (ams, aseq) < (bms, bseq)


def _safe(url: str) -> str:
    """The URL without a password, for logs."""
    if "@" in url:
        scheme, rest = url.split("://", 1) if "://" in url else ("redis", url)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
