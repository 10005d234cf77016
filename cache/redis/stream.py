"""The Redis 7 layout ("redis-stream"): entry hashes in a stock Redis (no modules), an index in every process.

Layout of one shard (key prefix `S`):
- `S:e:<entry id>`: a hash per entry (`cache.redis.codec`, float32 vector) with a TTL. The entry id starts with
  a hash of the tenant, so a tenant's keys are found by pattern and an exact lookup is one HGETALL.
- `S:z`: sorted set of entry ids by expiry time, for the size bound; with `S:t:<tenant tag>` and `S:tc`, each
  tenant's share of it (`cache.redis.fair`): a full shard evicts the largest holder's soonest-expiring entry.
- `S:ev`: a stream of index changes (put with the vector, del, tenant, all). A stock Redis 7 has no vector
  search, so each process keeps its own nearest-neighbour index: it loads it with SCAN at start, then follows
  the streams (`cache.redis.follower`).

On one server there is one shard, `S` = the prefix (default "tiergate:cache"). On a Redis Cluster
(`redis+cluster://`, see `cache.redis.conn`) there are `cluster_shards` of them, `S` = `{prefix:k}`: the hash
tag keeps each shard's keys in one slot, and an entry's shard is a hash of its id. So the entries spread over
the cluster's nodes while every script still touches one slot (`cache.redis.shards`). The size bound is then held
per shard (`max_entries / shards` each).

A put is one Lua script (write, expiry, size bound, events) so concurrent gateways cannot overshoot the bound
or miss an eviction event.

Tested in `tests/integration/test_cache_redis.py`.
"""

from __future__ import annotations

import math
import time
import uuid

import numpy as np
from redis.typing import EncodableT, FieldT

from tiergate.cache.keys import tenant_tag
from tiergate.cache.redis.codec import decode_entry, entry_fields, glob_escape
from tiergate.cache.redis.fair import FAIR_LUA, counts_key, tenant_key
from tiergate.cache.redis.follower import SCAN_BATCH, StreamFollower
from tiergate.cache.redis.layout import Conn
from tiergate.cache.redis.shards import Shard, Shards
from tiergate.cache.types import CacheEntry

__all__ = ["StreamLayout"]

_PUT = FAIR_LUA + """
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
tenant_add(ARGV[6], ARGV[1], ARGV[3])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'op', 'put', 'id', ARGV[1], 'ns', ARGV[8],
           'tt', ARGV[9], 'v', ARGV[10], 'e', ARGV[3], 'o', ARGV[7])
local t = redis.call('TIME')
while #take_expired(ARGV[6], KEYS[2], t[1], 500) == 500 do end
local evicted = 0
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if excess > 0 then
  for _, id in ipairs(fair_pop(ARGV[6], KEYS[2], excess)) do
    -- The evicted entry's key is built here, not declared: it is in this shard's slot (same hash tag).
    redis.call('DEL', ARGV[6] .. ':e:' .. id)
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[5], '*', 'op', 'del', 'id', id, 'o', '')
    evicted = evicted + 1
  end
end
return evicted
"""

_DELETE = FAIR_LUA + """
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
tenant_remove(ARGV[3], ARGV[1])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[2], '*', 'op', 'del', 'id', ARGV[1], 'o', '')
return n
"""


class StreamLayout:
    """Reads and writes entries in this layout's shards, and tells the other processes' indexes what changed;
    `follower` keeps this process's index in step with what they write."""

    kind = "redis-stream"

    def __init__(self, conn: Conn) -> None:
        self._c = conn
        self.index = conn.index
        settings = conn.settings
        self.shards = Shards(settings.prefix, conn.cluster, settings.cluster_shards)
        self._shard_max = math.ceil(settings.max_entries / len(self.shards))
        # Each shard's stream carries its share of the events, so it keeps its share of the history.
        self._stream_maxlen = math.ceil(settings.stream_maxlen / len(self.shards))
        self._put_script = conn.r.register_script(_PUT)
        self._delete_script = conn.bg.register_script(_DELETE)
        self._origin = uuid.uuid4().hex  # marks our events: the follower skips them (applied when made)
        self.follower = StreamFollower(conn, self.shards, self._origin)

    def entries(self) -> int | None:
        return len(self.index)

    # -- request path -----------------------------------------------------------------------------------
    async def get_many(self, namespace: str, entry_ids: list[str]) -> list[CacheEntry | None]:
        async with self._c.r.pipeline(transaction=False) as pipe:
            for eid in entry_ids:
                pipe.hgetall(self.shards.of(eid).key(eid))
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
        shard = self.shards.of(entry.id)
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
        shard = self.shards.of(entry_id)
        n = await self._delete_script(keys=[shard.key(entry_id), shard.zset, shard.stream],
                                      args=[entry_id, self._stream_maxlen, shard.prefix])
        self.index.remove(entry_id)
        return int(n)

    async def delete_tenant(self, tag: str) -> int:
        n = await self._delete_matching(f"{self.shards.entry_glob}{tag}-*")
        for shard in self.shards:  # the tenant's share of the bound (one slot per command on a Cluster)
            await self._c.bg.delete(tenant_key(shard.prefix, tag))
            await self._c.bg.zrem(counts_key(shard.prefix), tag)
        self.index.remove_tenant(tag)  # here, now; the event (which we skip) tells the other processes
        await self._event({"op": "tenant", "tt": tag})
        return n

    async def delete_all(self) -> int:
        n = await self._delete_matching(f"{self.shards.entry_glob}*")
        for shard in self.shards:  # one key per command: shards live in different slots on a Cluster
            await self._c.bg.delete(shard.zset)
            await self._c.bg.delete(counts_key(shard.prefix))
            async for key in self._c.bg.scan_iter(match=tenant_key(glob_escape(shard.prefix), "*"), count=SCAN_BATCH):
                await self._c.bg.delete(key)
        self.index.clear()
        await self._event({"op": "all"})
        return n

    async def has_data(self) -> bool:
        return any([await self._c.bg.exists(shard.zset) for shard in self.shards])

    async def _delete_matching(self, pattern: str) -> int:
        deleted = 0
        batch: list[bytes] = []
        async for key in self._c.bg.scan_iter(match=pattern, count=SCAN_BATCH):
            batch.append(key)
            if len(batch) >= SCAN_BATCH:
                deleted += await self._delete_keys(batch)
                batch = []
        if batch:
            deleted += await self._delete_keys(batch)
        return deleted

    async def _delete_keys(self, keys: list[bytes]) -> int:
        by_shard: dict[Shard, tuple[list[bytes], list[str]]] = {}
        for k in keys:
            owned = self.shards.owned(k)
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
            for shard in self.shards:
                pipe.xadd(shard.stream, {**fields, "o": self._origin}, maxlen=self._stream_maxlen, approximate=True)
            await pipe.execute()

    # -- background: agree on the shards, then load and follow ------------------------------------------------
    async def prepare(self) -> None:
        if len(self.shards) > 1:
            await self.shards.check_agreement(self._c)

    async def on_connect(self, restarted: bool) -> None:
        await self.follower.on_connect(restarted)

    async def run(self) -> None:
        await self.follower.run()
