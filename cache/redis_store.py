"""Cache entries in a stock Redis 7 (no modules), shared by every gateway process.

Layout of one shard (key prefix `S`):
- `S:e:<entry id>`: a hash per entry (tenant, namespace, text, answer JSON, float32 embedding bytes,
  budget, times) with a TTL. The entry id starts with a hash of the tenant, so a tenant's keys are
  found by pattern and an exact lookup is one HGETALL.
- `S:z`: sorted set of entry ids by expiry time, for the size bound (soonest-expiring evicted first).
- `S:ev`: a stream of index changes (put with the vector, del, tenant, all). Debian's Redis has no vector
  search, so each process keeps its own nearest-neighbour index: it loads it with SCAN at start, then
  follows the streams. After a Redis restart (new run id) or a gap (a stream trimmed past the last event
  read), it reloads from scratch.

On one server there is one shard, `S` = the prefix (default "tiergate:cache"). On a Redis Cluster
(`redis+cluster://`, see `cache.redis_conn`) there are `cluster_shards` of them, `S` = `{prefix:k}`: the
hash tag keeps each shard's keys in one slot, and an entry's shard is a hash of its id. So the entries
spread over the cluster's nodes while every script still touches one slot. The size bound is then held
per shard (`max_entries / shards` each).

A put is one Lua script (write, expiry, size bound, events) so concurrent gateways cannot overshoot the
bound or miss an eviction event. Request-path commands have a short timeout and no retries: when Redis is
down or slow the store reports `StoreUnavailable` at once (the cache is bypassed) until a background probe
sees it answer again.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import numpy as np
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from cache.index import VectorIndex
from cache.keys import tenant_tag
from cache.metrics import CacheMetrics
from cache.redis_conn import AnyRedis, is_cluster, open_redis, safe_url
from cache.settings import CacheSettings
from cache.store import StoreUnavailable
from cache.types import CachedAnswer, CacheEntry

__all__ = ["RedisStore"]

log = structlog.get_logger("tiergate.cache.redis")
T = TypeVar("T")

# RedisClusterException (no slot map, slot not covered) is not a RedisError, but it is Redis failing all the same.
_FAILURES = (RedisError, RedisClusterException, OSError, TimeoutError, asyncio.TimeoutError)
_BLOCK_MS = 250  # stream poll: also how soon the follower notices that a request saw Redis fail
_POLL_S = 0.1  # on a Cluster (no blocking reads): how often every shard's stream is read
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
    -- The evicted entry's key is built here, not declared: it is in this shard's slot (same hash tag).
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


def _glob_escape(text: str) -> str:
    """`text` matched literally in a SCAN MATCH pattern."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


@dataclass(frozen=True, slots=True)
class _Shard:
    prefix: str
    zset: str
    stream: str

    @classmethod
    def named(cls, prefix: str) -> _Shard:
        return cls(prefix, f"{prefix}:z", f"{prefix}:ev")

    def key(self, entry_id: str) -> str:
        return f"{self.prefix}:e:{entry_id}"


class RedisStore:
    in_process = False

    def __init__(self, url: str, index: VectorIndex, settings: CacheSettings, metrics: CacheMetrics) -> None:
        self.index = index
        self.url = url
        self._s = settings
        self._m = metrics
        cluster = is_cluster(url)
        p = settings.prefix
        if cluster:
            self._shards = [_Shard.named(f"{{{p}:{k}}}") for k in range(settings.cluster_shards)]
            # The braces are literal in a SCAN pattern. The pattern also matches other prefixes that start
            # with ours (`{tiergate:cache:eu:3}`), so every key found is checked against our shards (_owned_key).
            self._entry_glob = f"{{{_glob_escape(p)}:*}}:e:"
        else:
            self._shards = [_Shard.named(p)]
            self._entry_glob = f"{_glob_escape(p)}:e:"
        self._by_prefix = {shard.prefix: shard for shard in self._shards}
        self._shard_max = math.ceil(settings.max_entries / len(self._shards))
        # Each shard's stream carries its share of the events, so it keeps its share of the history.
        self._stream_maxlen = math.ceil(settings.stream_maxlen / len(self._shards))
        no_retry = Retry(NoBackoff(), 0)
        t = settings.redis_timeout_s
        # Request path: one short timeout, no retries (a retry is the caller's next request).
        self._r: AnyRedis = open_redis(url, socket_timeout=t, socket_connect_timeout=t, retry=no_retry,
                                       health_check_interval=0, max_connections=256)
        # Background work (stream followers, loading, admin): longer timeouts, never on the request path.
        self._bg: AnyRedis = open_redis(url, socket_timeout=_BLOCK_MS / 1000 + 5, socket_connect_timeout=2.0,
                                        retry=no_retry, health_check_interval=0,
                                        max_connections=8 + len(self._shards))
        self._put_script = self._r.register_script(_PUT)
        self._delete_script = self._bg.register_script(_DELETE)
        self._origin = uuid.uuid4().hex
        self._up = False
        self._strikes = 0
        self._run_id: str | None = None
        self._last_event = [b"0-0"] * len(self._shards)
        self._misconfigured_logged = False
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self, wait_s: float = 5.0) -> None:
        """Connect and load the index in the background; wait for the first attempt (bounded), so a fresh
        gateway already hits, and a gateway whose Redis is down starts at once (bypassing the cache)."""
        if self._task is None:
            self._task = asyncio.create_task(self._supervise(), name="tiergate-cache-redis")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await self._ready.wait()

    async def start_admin(self) -> None:
        """Connect for admin commands only (CLI): no index load, no stream following."""
        await self._admin(lambda: self._bg.ping())
        self._up = True

    async def stop(self) -> None:
        # Ends the loops even if a cancellation gets lost inside a Redis client call; the timeouts here are
        # `asyncio.timeout`, not `wait_for`, whose 3.11 version can swallow a cancellation that races a result.
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            # Bounded: shutting down must not wait on a Redis client that does not finish cancelling.
            done, _ = await asyncio.wait({self._task}, timeout=5.0)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: it ended as it ends, nothing to report at shutdown
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
                    pipe.hgetall(self._shard(eid).key(eid))
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
        shard = self._shard(entry.id)
        args = [entry.id, ttl_ms, repr(entry.expires_at), self._shard_max, self._stream_maxlen, shard.prefix,
                self._origin, entry.namespace, tenant_tag(entry.tenant), vec, *fields]
        evicted = await self._call(
            lambda: self._put_script(keys=[shard.key(entry.id), shard.zset, shard.stream], args=args))
        if vector is not None:
            self.index.upsert(entry.id, entry.namespace, tenant_tag(entry.tenant), vector, entry.expires_at)
        else:
            self.index.remove(entry.id)
        return int(evicted)

    # -- admin (bounded, but not held to the request-path timeout) ------------------------------------
    async def delete(self, entry_id: str) -> int:
        shard = self._shard(entry_id)
        n = await self._admin(lambda: self._delete_script(
            keys=[shard.key(entry_id), shard.zset, shard.stream], args=[entry_id, self._stream_maxlen]))
        self.index.remove(entry_id)
        return int(n)

    async def delete_tenant(self, tenant: str) -> int:
        tag = tenant_tag(tenant)
        n = await self._admin(lambda: self._delete_matching(f"{self._entry_glob}{tag}-*"))
        self.index.remove_tenant(tag)  # here, now; the event (which we skip) tells the other processes
        await self._admin(lambda: self._event({"op": "tenant", "tt": tag}))
        return n

    async def delete_all(self) -> int:
        n = await self._admin(lambda: self._delete_matching(f"{self._entry_glob}*"))
        for shard in self._shards:  # one key per command: shards live in different slots on a Cluster
            await self._admin(lambda shard=shard: self._bg.delete(shard.zset))
        self.index.clear()
        await self._admin(lambda: self._event({"op": "all"}))
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
        by_shard: dict[_Shard, tuple[list[bytes], list[str]]] = {}
        for k in keys:
            owned = self._owned_key(k)
            if owned is None:
                continue  # another deployment's key that the pattern also matched
            shard, eid = owned
            ks, ids = by_shard.setdefault(shard, ([], []))
            ks.append(k)
            ids.append(eid)
        if not by_shard:
            return 0
        async with self._bg.pipeline(transaction=False) as pipe:
            for shard, (ks, ids) in by_shard.items():  # a multi-key DEL stays within one shard's slot
                pipe.delete(*ks)
                pipe.zrem(shard.zset, *ids)
            replies = await pipe.execute()
        return sum(int(n) for n in replies[::2])

    async def _event(self, fields: dict[str, str]) -> None:
        """Tell the other processes' indexes (tenant and all: on every shard's stream, as each is followed
        alone). Marked as ours: this process applied it already, and a copy read back later would also drop
        what this process stored since."""
        async with self._bg.pipeline(transaction=False) as pipe:
            for shard in self._shards:
                pipe.xadd(shard.stream, {**fields, "o": self._origin}, maxlen=self._stream_maxlen, approximate=True)
            await pipe.execute()

    # -- failure handling -------------------------------------------------------------------------------
    async def _call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if not self._up:
            raise StoreUnavailable("redis is down")
        try:
            async with asyncio.timeout(self._s.redis_timeout_s):
                result = await fn()
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
            async with asyncio.timeout(30.0):
                return await fn()
        except _FAILURES as exc:
            self._mark_down(exc)
            raise StoreUnavailable(str(exc) or type(exc).__name__) from exc

    def _mark_down(self, exc: BaseException) -> None:
        if self._up:
            log.warning("cache_redis_down", error=repr(exc), url=safe_url(self.url))
        self._up = False
        self._strikes = 0
        self._m.redis_up.set(0)
        self._wake.set()

    # -- background: connect, load, follow ----------------------------------------------------------------
    async def _supervise(self) -> None:
        while not self._stopping:
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
                    async with asyncio.timeout(self._s.retry_every_s):
                        await self._wake.wait()
            except Exception as exc:
                self._m.errors.labels("sync").inc()
                log.exception("cache_sync_error", error=repr(exc))
                await asyncio.sleep(self._s.retry_every_s)

    async def _connect(self) -> None:
        async with asyncio.timeout(5.0):
            run_id = await self._run_ids()
        if len(self._shards) > 1:
            async with asyncio.timeout(5.0):
                await self._check_shards()
        needs_reload = run_id != self._run_id or await self._gap()
        # Connections opened before the outage point at a dead socket: drop them, not a request later.
        with contextlib.suppress(Exception):
            if isinstance(self._r, RedisCluster):
                await self._r.aclose()  # and learn the slots again on the next command (a failover moves them)
            else:
                await self._r.connection_pool.disconnect()
        self._up = True
        self._m.redis_up.set(1)
        if needs_reload:
            await self._reload()
            self._run_id = run_id
        log.info("cache_redis_up", url=safe_url(self.url), reloaded=needs_reload, entries=len(self.index),
                 shards=len(self._shards))
        self._ready.set()

    async def _run_ids(self) -> str:
        """Who is serving: the run id of the server, or of every Cluster primary. A change means a restart
        (its data may be gone), so the index is reloaded."""
        if isinstance(self._bg, RedisCluster):
            await self._bg.aclose()  # a node may have failed over or come back: learn the topology anew
            infos = await self._bg.info("server", target_nodes=RedisCluster.PRIMARIES)
            return ",".join(sorted(str(i.get("run_id")) for i in infos.values()))
        info = await self._bg.info("server")
        if info.get("redis_mode") == "cluster":
            if not self._misconfigured_logged:
                log.error("cache_redis_is_a_cluster", url=safe_url(self.url),
                          fix="this Redis is a Cluster node: use a redis+cluster:// URL (see docs/cache.md)")
                self._misconfigured_logged = True
            raise RedisError(f"{safe_url(self.url)} is a Redis Cluster node; use redis+cluster://")
        return str(info.get("run_id"))

    async def _check_shards(self) -> None:
        """Every gateway on a Cluster must split the cache into the same shards: with another count they would
        look for entries in other shards and follow other streams, missing each other's answers. The first
        gateway records its count in shard 0 (`{prefix:0}:shards`); one configured differently bypasses the
        cache and says why, until the count is fixed (or, to change it for good, the prefix's keys and that
        one are deleted)."""
        key = f"{self._shards[0].prefix}:shards"
        n = len(self._shards)
        await self._bg.set(key, n, nx=True)
        stored = await self._bg.get(key)
        if stored is not None and int(stored) != n:
            if not self._misconfigured_logged:
                log.error("cache_cluster_shards_mismatch", url=safe_url(self.url), configured=n, in_redis=int(stored),
                          fix=f"set cluster_shards to {int(stored)} like the other gateways (see docs/cache.md)")
                self._misconfigured_logged = True
            raise RedisError(f"this gateway splits the cache into {n} shards, the others into {int(stored)}")

    async def _gap(self) -> bool:
        """True when the last event we read of some shard is no longer in its stream: we may have missed
        some after it. A stream is trimmed only at its old end, so we fell `stream_maxlen` events behind."""
        for shard, last in zip(self._shards, self._last_event, strict=True):
            first = await self._bg.xrange(shard.stream, count=1)
            if first and _id_lt(last, first[0][0]):
                return True
        return False

    async def _reload(self) -> None:
        for i, shard in enumerate(self._shards):
            last = await self._bg.xrevrange(shard.stream, count=1)
            self._last_event[i] = last[0][0] if last else b"0-0"
        self.index.clear()
        self._m.resyncs.inc()
        batch: list[bytes] = []
        async for key in self._bg.scan_iter(match=f"{self._entry_glob}*", count=_SCAN_BATCH):
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
            owned = self._owned_key(k)
            if owned is None or not ns or not v or not e or len(v) != 4 * self.index.dim:
                continue
            eid = owned[1]
            ids.append(eid)
            nss.append(ns.decode())
            tags.append(eid.split("-", 1)[0])
            vecs.append(np.frombuffer(v, "<f4"))
            exps.append(float(e))
        if ids:
            self.index.upsert_many(ids, nss, tags, np.stack(vecs), exps)

    async def _follow(self) -> None:
        """Apply other processes' changes as they come. One server: one blocking XREAD at a time. A Cluster:
        an XREAD names keys of one slot, and long blocking reads on many nodes at once do not cancel
        cleanly in redis-py's cluster client, so every shard's stream is polled in one pipeline instead."""
        while self._up and not self._stopping:
            if isinstance(self._bg, RedisCluster):
                async with self._bg.pipeline(transaction=False) as pipe:
                    for shard, last in zip(self._shards, self._last_event, strict=True):
                        pipe.xread({shard.stream: last}, count=500)
                    replies = await pipe.execute()
            else:
                replies = [await self._bg.xread({self._shards[0].stream: self._last_event[0]}, count=500,
                                                block=_BLOCK_MS)]
            for i, resp in enumerate(replies):
                for _stream, events in resp or ():
                    for event_id, fields in events:
                        self._apply(fields, i)
                        self._last_event[i] = event_id
            self._m.entries.set(len(self.index))
            if isinstance(self._bg, RedisCluster) and not any(replies):
                await asyncio.sleep(_POLL_S)

    def _apply(self, f: dict[bytes, bytes], shard: int = 0) -> None:
        """One event of shard `shard`'s stream. `tenant` and `all` are sent to every shard's stream and each
        copy covers its own shard's entries only: the streams are read one after another, so a copy applied
        to everything would also drop what another shard stored after the invalidation."""
        op = f.get(b"op")
        if f.get(b"o") == self._origin.encode():
            return  # our own put or invalidation, applied when we made it
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
            tag = f[b"tt"].decode()
            if len(self._shards) == 1:
                self.index.remove_tenant(tag)
            else:
                self.index.remove_where(lambda eid, tt: tt == tag and self._shard_index(eid) == shard)
        elif op == b"all":
            if len(self._shards) == 1:
                self.index.clear()
            else:
                self.index.remove_where(lambda eid, _tt: self._shard_index(eid) == shard)

    # -- encoding ------------------------------------------------------------------------------------------
    def _shard_index(self, entry_id: str) -> int:
        return 0 if len(self._shards) == 1 else zlib.crc32(entry_id.encode()) % len(self._shards)

    def _shard(self, entry_id: str) -> _Shard:
        return self._shards[self._shard_index(entry_id)]

    def _owned_key(self, key: bytes) -> tuple[_Shard, str] | None:
        """(shard, entry id) of an entry key of this store, read from the key itself; None for anyone else's."""
        prefix, sep, eid = key.decode().rpartition(":e:")
        shard = self._by_prefix.get(prefix) if sep else None
        return None if shard is None or not eid else (shard, eid)

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

