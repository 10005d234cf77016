"""The Redis 7 layout ("redis-stream"): entry hashes in a stock Redis (no modules), an index in every process.

Layout of one shard (key prefix `S`):
- `S:e:<entry id>`: a hash per entry (`cache.redis.codec`, float32 vector) with a TTL. The entry id starts with
  a hash of the tenant, so a tenant's keys are found by pattern and an exact lookup is one HGETALL.
- `S:z`: sorted set of entry ids by expiry time, for the size bound (soonest-expiring evicted first).
- `S:ev`: a stream of index changes (put with the vector, del, tenant, all). A stock Redis 7 has no vector
  search, so each process keeps its own nearest-neighbour index: it loads it with SCAN at start, then follows
  the streams. After a Redis restart (new run id) or a gap (a stream trimmed past the last event read), it
  reloads from scratch.

On one server there is one shard, `S` = the prefix (default "tiergate:cache"). On a Redis Cluster
(`redis+cluster://`, see `cache.redis.conn`) there are `cluster_shards` of them, `S` = `{prefix:k}`: the hash
tag keeps each shard's keys in one slot, and an entry's shard is a hash of its id. So the entries spread over
the cluster's nodes while every script still touches one slot. The size bound is then held per shard
(`max_entries / shards` each).

A put is one Lua script (write, expiry, size bound, events) so concurrent gateways cannot overshoot the bound
or miss an eviction event.

Tested in `tests/integration/test_cache_redis.py`.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
from redis.asyncio.cluster import RedisCluster
from redis.typing import EncodableT, FieldT

from tiergate.cache.keys import tenant_tag
from tiergate.cache.redis.codec import decode_entry, entry_fields, glob_escape
from tiergate.cache.redis.layout import BLOCK_MS, Conn, Misconfigured
from tiergate.cache.types import CacheEntry

__all__ = ["StreamLayout"]

log = structlog.get_logger("tiergate.cache.redis")

_POLL_S = 0.1  # on a Cluster (no blocking reads): how often every shard's stream is read
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


class StreamLayout:
    kind = "redis-stream"

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self.index = conn.index
        settings = conn.settings
        p = settings.prefix
        if conn.cluster:
            self._shards = [_Shard.named(f"{{{p}:{k}}}") for k in range(settings.cluster_shards)]
            # The braces are literal in a SCAN pattern. The pattern also matches other prefixes that start
            # with ours (`{tiergate:cache:eu:3}`), so every key found is checked against our shards (_owned_key).
            self._entry_glob = f"{{{glob_escape(p)}:*}}:e:"
        else:
            self._shards = [_Shard.named(p)]
            self._entry_glob = f"{glob_escape(p)}:e:"
        self._by_prefix = {shard.prefix: shard for shard in self._shards}
        self._shard_max = math.ceil(settings.max_entries / len(self._shards))
        # Each shard's stream carries its share of the events, so it keeps its share of the history.
        self._stream_maxlen = math.ceil(settings.stream_maxlen / len(self._shards))
        self._put_script = conn.r.register_script(_PUT)
        self._delete_script = conn.bg.register_script(_DELETE)
        self._origin = uuid.uuid4().hex
        self._last_event = [b"0-0"] * len(self._shards)
        self._mismatch_logged = False

    def entries(self) -> int | None:
        return len(self.index)

    # -- request path -----------------------------------------------------------------------------------
    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        async with self._c.r.pipeline(transaction=False) as pipe:
            for eid in entry_ids:
                pipe.hgetall(self._shard(eid).key(eid))
            rows = await pipe.execute(raise_on_error=False)
        out: list[CacheEntry | None] = []
        for eid, row in zip(entry_ids, rows, strict=True):
            entry = decode_entry(eid, row, self._c.metrics, self.index.dim)
            if entry is None and eid in self.index:
                self.index.remove(eid)  # expired, evicted or unreadable while our index still had it
            out.append(entry)
        return out

    async def nearest(self, namespace: str, vector: np.ndarray, k: int,
                      min_sim: float) -> list[tuple[CacheEntry, float]]:
        found = [(eid, s) for eid, s in self.index.search(namespace, vector, k) if s >= min_sim]
        if not found:
            return []
        entries = await self.get_many(namespace, [eid for eid, _ in found])
        return [(e, s) for (_, s), e in zip(found, entries, strict=True) if e is not None]

    async def put(self, entry: CacheEntry, vector: np.ndarray | None) -> int:
        ttl_ms = max(int((entry.expires_at - time.time()) * 1000), 1)
        vec = b"" if vector is None else np.asarray(vector, "<f4").tobytes()
        shard = self._shard(entry.id)
        args = [entry.id, ttl_ms, repr(entry.expires_at), self._shard_max, self._stream_maxlen, shard.prefix,
                self._origin, entry.namespace, tenant_tag(entry.tenant), vec,
                *entry_fields(entry, vector, half=False)]
        evicted = await self._put_script(keys=[shard.key(entry.id), shard.zset, shard.stream], args=args)
        if vector is not None:
            self.index.upsert(entry.id, entry.namespace, tenant_tag(entry.tenant), vector, entry.expires_at)
        else:
            self.index.remove(entry.id)
        return int(evicted)

    # -- admin -------------------------------------------------------------------------------------------
    async def delete(self, entry_id: str, namespace: str | None) -> int:
        shard = self._shard(entry_id)
        n = await self._delete_script(keys=[shard.key(entry_id), shard.zset, shard.stream],
                                      args=[entry_id, self._stream_maxlen])
        self.index.remove(entry_id)
        return int(n)

    async def delete_tenant(self, tag: str) -> int:
        n = await self._delete_matching(f"{self._entry_glob}{tag}-*")
        self.index.remove_tenant(tag)  # here, now; the event (which we skip) tells the other processes
        await self._event({"op": "tenant", "tt": tag})
        return n

    async def delete_all(self) -> int:
        n = await self._delete_matching(f"{self._entry_glob}*")
        for shard in self._shards:  # one key per command: shards live in different slots on a Cluster
            await self._c.bg.delete(shard.zset)
        self.index.clear()
        await self._event({"op": "all"})
        return n

    async def has_data(self) -> bool:
        return any([await self._c.bg.exists(shard.zset) for shard in self._shards])

    async def _delete_matching(self, pattern: str) -> int:
        deleted = 0
        batch: list[bytes] = []
        async for key in self._c.bg.scan_iter(match=pattern, count=_SCAN_BATCH):
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
        async with self._c.bg.pipeline(transaction=False) as pipe:
            for shard, (ks, ids) in by_shard.items():  # a multi-key DEL stays within one shard's slot
                pipe.delete(*ks)
                pipe.zrem(shard.zset, *ids)
            replies = await pipe.execute()
        return sum(int(n) for n in replies[::2])

    async def _event(self, fields: dict[FieldT, EncodableT]) -> None:
        """Tell the other processes' indexes (tenant and all: on every shard's stream, as each is followed
        alone). Marked as ours: this process applied it already, and a copy read back later would also drop
        what this process stored since."""
        async with self._c.bg.pipeline(transaction=False) as pipe:
            for shard in self._shards:
                pipe.xadd(shard.stream, {**fields, "o": self._origin}, maxlen=self._stream_maxlen, approximate=True)
            await pipe.execute()

    # -- background: load, follow ------------------------------------------------------------------------
    async def prepare(self) -> None:
        if len(self._shards) > 1:
            await self._check_shards()

    async def on_connect(self, restarted: bool) -> None:
        if restarted or await self._gap():
            await self._reload()

    async def _check_shards(self) -> None:
        """Every gateway on a Cluster must split the cache into the same shards: with another count they would
        look for entries in other shards and follow other streams, missing each other's answers. The first
        gateway records its count in shard 0 (`{prefix:0}:shards`); one configured differently bypasses the
        cache and says why, until the count is fixed (or, to change it for good, the prefix's keys and that
        one are deleted)."""
        key = f"{self._shards[0].prefix}:shards"
        n = len(self._shards)
        await self._c.bg.set(key, n, nx=True)
        stored = await self._c.bg.get(key)
        if stored is not None and int(stored) != n:
            if not self._mismatch_logged:
                log.error("cache_cluster_shards_mismatch", url=self._c.url, configured=n, in_redis=int(stored),
                          fix=f"set cluster_shards to {int(stored)} like the other gateways (see docs/cache.md)")
                self._mismatch_logged = True
            raise Misconfigured(f"this gateway splits the cache into {n} shards, the others into {int(stored)}")

    async def _gap(self) -> bool:
        """True when the last event we read of some shard is no longer in its stream: we may have missed
        some after it. A stream is trimmed only at its old end, so we fell `stream_maxlen` events behind."""
        for shard, last in zip(self._shards, self._last_event, strict=True):
            first = await self._c.bg.xrange(shard.stream, count=1)
            if first and _id_lt(last, _stream_id(first[0][0])):
                return True
        return False

    async def _reload(self) -> None:
        for i, shard in enumerate(self._shards):
            last = await self._c.bg.xrevrange(shard.stream, count=1)
            self._last_event[i] = _stream_id(last[0][0]) if last else b"0-0"
        self.index.clear()
        self._c.metrics.resyncs.inc()
        batch: list[bytes] = []
        async for key in self._c.bg.scan_iter(match=f"{self._entry_glob}*", count=_SCAN_BATCH):
            batch.append(key)
            if len(batch) >= _SCAN_BATCH:
                await self._load_keys(batch)
                batch = []
        if batch:
            await self._load_keys(batch)
        self._c.metrics.entries.set(len(self.index))

    async def _load_keys(self, keys: list[bytes]) -> None:
        async with self._c.bg.pipeline(transaction=False) as pipe:
            for k in keys:
                pipe.hmget(k, "ns", "v", "e")
            rows = await pipe.execute(raise_on_error=False)
        ids, nss, tags, vecs, exps = [], [], [], [], []
        for k, row in zip(keys, rows, strict=True):
            owned = self._owned_key(k)
            if owned is None or isinstance(row, BaseException):
                continue
            ns, v, e = row
            if not ns or not v or not e or len(v) != 4 * self.index.dim:
                continue
            eid = owned[1]
            try:
                exp = float(e)
            except ValueError:
                continue
            ids.append(eid)
            nss.append(ns.decode(errors="replace"))
            tags.append(eid.split("-", 1)[0])
            vecs.append(np.frombuffer(v, "<f4"))
            exps.append(exp)
        if ids:
            self.index.upsert_many(ids, nss, tags, np.stack(vecs), exps)

    async def run(self) -> None:
        """Apply other processes' changes as they come. One server: one blocking XREAD at a time. A Cluster:
        an XREAD names keys of one slot, and long blocking reads on many nodes at once do not cancel
        cleanly in redis-py's cluster client, so every shard's stream is polled in one pipeline instead."""
        bg = self._c.bg
        while self._c.up and not self._c.stopping:
            replies: list[Any]
            if isinstance(bg, RedisCluster):
                async with bg.pipeline(transaction=False) as pipe:
                    for shard, last in zip(self._shards, self._last_event, strict=True):
                        pipe.xread({shard.stream: last}, count=500)
                    replies = await pipe.execute()
            else:
                replies = [await bg.xread({self._shards[0].stream: self._last_event[0]}, count=500,
                                          block=BLOCK_MS)]
            for i, resp in enumerate(replies):
                for _stream, events in resp or ():
                    for event_id, fields in events:
                        self._apply(fields, i)
                        self._last_event[i] = event_id
            self._c.metrics.entries.set(len(self.index))
            if isinstance(bg, RedisCluster) and not any(replies):
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

    # -- keys ----------------------------------------------------------------------------------------------
    def _shard_index(self, entry_id: str) -> int:
        return 0 if len(self._shards) == 1 else zlib.crc32(entry_id.encode()) % len(self._shards)

    def _shard(self, entry_id: str) -> _Shard:
        return self._shards[self._shard_index(entry_id)]

    def _owned_key(self, key: bytes) -> tuple[_Shard, str] | None:
        """(shard, entry id) of an entry key of this layout, read from the key itself; None for anyone else's."""
        prefix, sep, eid = key.decode(errors="replace").rpartition(":e:")
        shard = self._by_prefix.get(prefix) if sep else None
        return None if shard is None or not eid else (shard, eid)


def _id_lt(a: bytes, b: bytes) -> bool:
    ams, aseq = (int(x) for x in a.split(b"-"))
    bms, bseq = (int(x) for x in b.split(b"-"))
    return (ams, aseq) < (bms, bseq)


def _stream_id(raw: bytes | str | None) -> bytes:
    """A stream entry's id as this module's clients return it (bytes: they do not decode responses)."""
    assert isinstance(raw, bytes), raw
    return raw
