"""The stream layout's replica: this process's index, kept in step with the entries in Redis.

A stock Redis 7 has no vector search, so each process keeps its own nearest-neighbour index of the entries
(`cache.redis.stream`). It loads it with SCAN at connect, then follows every shard's stream of changes (put with
the vector, del, tenant, all) written by the other processes. After a Redis restart (new run id) or a gap (a
stream trimmed past the last event read), it reloads from scratch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from redis.asyncio.cluster import RedisCluster

from tiergate.cache.redis.layout import BLOCK_MS, Conn
from tiergate.cache.redis.shards import Shards

__all__ = ["SCAN_BATCH", "StreamFollower"]

POLL_S = 0.1  # on a Cluster (no blocking reads): how often every shard's stream is read
SCAN_BATCH = 1000


class StreamFollower:
    """Follows the shards' streams into `conn.index`, skipping the events marked with this process's `origin`
    (applied to the index when they were made)."""

    def __init__(self, conn: Conn, shards: Shards, origin: str) -> None:
        self._c = conn
        self.index = conn.index
        self._shards = shards
        self._origin = origin.encode()
        self.last_event = [b"0-0"] * len(shards)  # per shard: the id of the last event applied

    async def on_connect(self, restarted: bool) -> None:
        if restarted or await self._gap():
            await self._reload()

    async def _gap(self) -> bool:
        """True when the last event we read of some shard is no longer in its stream: we may have missed
        some after it. A stream is trimmed only at its old end, so we fell `stream_maxlen` events behind."""
        for shard, last in zip(self._shards, self.last_event, strict=True):
            first = await self._c.bg.xrange(shard.stream, count=1)
            if first and _id_lt(last, _stream_id(first[0][0])):
                return True
        return False

    async def _reload(self) -> None:
        for i, shard in enumerate(self._shards):
            last = await self._c.bg.xrevrange(shard.stream, count=1)
            self.last_event[i] = _stream_id(last[0][0]) if last else b"0-0"
        self.index.clear()
        self._c.metrics.resyncs.inc()
        batch: list[bytes] = []
        async for key in self._c.bg.scan_iter(match=f"{self._shards.entry_glob}*", count=SCAN_BATCH):
            batch.append(key)
            if len(batch) >= SCAN_BATCH:
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
            owned = self._shards.owned(k)
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
                    for shard, last in zip(self._shards, self.last_event, strict=True):
                        pipe.xread({shard.stream: last}, count=500)
                    replies = await pipe.execute()
            else:
                replies = [await bg.xread({self._shards[0].stream: self.last_event[0]}, count=500,
                                          block=BLOCK_MS)]
            for i, resp in enumerate(replies):
                for _stream, events in resp or ():
                    for event_id, fields in events:
                        self.apply(fields, i)
                        self.last_event[i] = event_id
            self._c.metrics.entries.set(len(self.index))
            if isinstance(bg, RedisCluster) and not any(replies):
                await asyncio.sleep(POLL_S)

    def apply(self, f: dict[bytes, bytes], shard: int = 0) -> None:
        """One event of shard `shard`'s stream. `tenant` and `all` are sent to every shard's stream and each
        copy covers its own shard's entries only: the streams are read one after another, so a copy applied
        to everything would also drop what another shard stored after the invalidation."""
        op = f.get(b"op")
        if f.get(b"o") == self._origin:
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
                self.index.remove_where(lambda eid, tt: tt == tag and self._shards.index_of(eid) == shard)
        elif op == b"all":
            if len(self._shards) == 1:
                self.index.clear()
            else:
                self.index.remove_where(lambda eid, _tt: self._shards.index_of(eid) == shard)


def _id_lt(a: bytes, b: bytes) -> bool:
    ams, aseq = (int(x) for x in a.split(b"-"))
    bms, bseq = (int(x) for x in b.split(b"-"))
    return (ams, aseq) < (bms, bseq)


def _stream_id(raw: bytes | str | None) -> bytes:
    """A stream entry's id as this module's clients return it (bytes: they do not decode responses)."""
    assert isinstance(raw, bytes), raw
    return raw
