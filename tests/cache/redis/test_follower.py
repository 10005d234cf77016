"""The stream layout's replica: events from other processes applied to this process's index (its own skipped,
invalidations per shard), and a reload from Redis after a restart or a gap."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from tests.cache.helpers import fresh_metrics
from tests.support.redis import RedisServer, flushed
from tiergate.cache.index import VectorIndex
from tiergate.cache.redis.follower import StreamFollower
from tiergate.cache.redis.shards import Shards

pytestmark = pytest.mark.anyio

DIM = 4


def vec(i: int) -> bytes:
    v = np.zeros(DIM, "<f4")
    v[i % DIM] = 1.0
    return v.tobytes()


def put(eid: str, tag: str = "t1", origin: str = "other") -> dict[bytes, bytes]:
    return {b"op": b"put", b"id": eid.encode(), b"ns": b"ns", b"tt": tag.encode(), b"v": vec(len(eid)),
            b"e": b"9999999999", b"o": origin.encode()}


def follower(shards: Shards, conn: Any = None) -> StreamFollower:
    return StreamFollower(conn or SimpleNamespace(index=VectorIndex(DIM)), shards, "me")


def test_puts_and_deletes_of_others_are_applied_and_our_own_skipped() -> None:
    f = follower(Shards("p", cluster=False, count=1))
    f.apply(put("t1-a"))
    f.apply(put("t1-b", origin="me"))
    assert "t1-a" in f.index and "t1-b" not in f.index
    f.apply({b"op": b"put", b"id": b"t1-a", b"ns": b"ns", b"tt": b"t1", b"v": b"", b"e": b"1", b"o": b"x"})
    assert "t1-a" not in f.index  # a put without a vector removes what the index had
    f.apply(put("t1-c"))
    f.apply({b"op": b"del", b"id": b"t1-c", b"o": b""})
    assert len(f.index) == 0


def test_an_invalidation_covers_only_the_shard_whose_stream_carried_it() -> None:
    shards = Shards("p", cluster=True, count=4)
    f = follower(shards)
    ids = [f"t1-{n}" for n in range(40)]
    for eid in ids:
        f.apply(put(eid), shards.index_of(eid))
    f.apply({b"op": b"tenant", b"tt": b"t1", b"o": b"x"}, 2)
    assert [e for e in ids if e in f.index] == [e for e in ids if shards.index_of(e) != 2]
    f.apply({b"op": b"all", b"o": b"x"}, 1)
    assert all((eid in f.index) == (shards.index_of(eid) not in (1, 2)) for eid in ids)


async def test_a_restart_reloads_this_prefix_s_entries_from_redis(redis7_server: RedisServer) -> None:
    client = redis.asyncio.Redis.from_url(flushed(redis7_server))
    try:
        await client.hset("p:e:t1-a", mapping={"ns": "ns", "v": vec(1), "e": "9999999999"})
        await client.hset("p:e:t1-bad", mapping={"ns": "ns", "v": b"short", "e": "9999999999"})
        await client.hset("q:e:t1-other", mapping={"ns": "ns", "v": vec(2), "e": "9999999999"})
        await client.xadd("p:ev", {"op": "del", "id": "gone", "o": ""})
        metrics, _ = fresh_metrics()
        conn = SimpleNamespace(index=VectorIndex(DIM), bg=client, metrics=metrics)
        f = follower(Shards("p", cluster=False, count=1), conn)
        await f.on_connect(restarted=True)
        assert "t1-a" in f.index and len(f.index) == 1
        assert f.last_event[0] == (await client.xrevrange("p:ev", count=1))[0][0]
        await client.hset("p:e:t1-b", mapping={"ns": "ns", "v": vec(3), "e": "9999999999"})
        await f.on_connect(restarted=False)  # no gap: the stream still holds the last event read
        assert len(f.index) == 1
    finally:
        await client.aclose()
