"""The Redis store on real servers: which layout serves, the request path's failures (down, misconfigured) turned
into `StoreUnavailable` and a bypass until Redis answers again, and invalidations that reach every layout's
entries. (The link's own failure handling, slow answers included: tests/cache/redis/test_link.py.)"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry

from tests.cache.helpers import SETTINGS, answer, chat, fresh_metrics, sample
from tests.support.redis import RedisServer, flushed
from tests.support.waiting import eventually
from tiergate.cache.index import VectorIndex
from tiergate.cache.keys import request_key
from tiergate.cache.redis.store import RedisStore
from tiergate.cache.settings import CacheSettings
from tiergate.cache.store import StoreUnavailable
from tiergate.cache.types import CacheEntry

pytestmark = pytest.mark.anyio

DIM = 8
FAST = dataclasses.replace(SETTINGS, retry_every_s=0.05)


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def entry_for(question: str, tenant: str = "acme", ttl_s: float = 600) -> CacheEntry:
    k = request_key(chat(question), tenant)
    now = time.time()
    return CacheEntry(id=k.entry_id, tenant=k.tenant, namespace=k.namespace, text=k.text,
                      answer=answer(f"answer to {question}"), created=now, expires_at=now + ttl_s)


def major_version(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(str(client.info("server")["redis_version"]).split(".")[0])
    finally:
        client.close()


Make = Callable[..., tuple[RedisStore, CollectorRegistry]]


@pytest.fixture
async def make_store() -> AsyncIterator[Make]:
    stores: list[RedisStore] = []

    def make(url: str, settings: CacheSettings = FAST) -> tuple[RedisStore, CollectorRegistry]:
        metrics, registry = fresh_metrics()
        store = RedisStore(url, VectorIndex(DIM), settings, metrics)
        stores.append(store)
        return store, registry

    yield make
    for store in stores:
        await store.stop()


async def test_the_layout_follows_the_server_and_entries_round_trip(make_store: Make, redis_url: str) -> None:
    store, registry = make_store(redis_url)
    assert store.kind == "redis" and not store.available()
    await store.get_many("ns", [])  # nothing asked: no Redis needed
    await store.start()
    assert store.available()
    assert store.kind == ("redis-vectorset" if major_version(redis_url) >= 8 else "redis-stream")
    described = store.describe()
    assert described["store"] == store.kind and described["up"] is True and described["requested"] == "auto"
    assert "problem" not in described
    assert sample(registry, "tiergate_cache_redis_up") == 1
    assert sample(registry, "tiergate_cache_store", store=store.kind) == 1

    e, v = entry_for("What is a black hole?"), unit(1)
    assert await store.put(e, v) == 0
    [got] = await store.get_many(e.namespace, [e.id])
    assert got is not None and got.answer == e.answer and got.text == e.text
    [(near, sim)] = await store.nearest(e.namespace, v, 4, 0.5)
    assert near.id == e.id and sim == pytest.approx(1.0, abs=1e-2)
    assert await store.nearest(e.namespace, -v, 4, 0.5) == []
    assert await store.delete(e.id, e.namespace) == 1
    assert await store.get_many(e.namespace, [e.id]) == [None]


async def test_the_stream_layout_can_be_asked_for_on_redis_8(make_store: Make, redis8_server: RedisServer) -> None:
    store, registry = make_store(flushed(redis8_server), dataclasses.replace(FAST, store="stream"))
    await store.start()
    assert store.kind == "redis-stream" and store.describe()["vector_sets"] is True
    assert sample(registry, "tiergate_cache_store", store="redis-vectorset") == 0


async def test_vector_sets_asked_of_redis_7_bypass_the_cache_and_say_why(make_store: Make,
                                                                         redis7_server: RedisServer) -> None:
    store, registry = make_store(flushed(redis7_server), dataclasses.replace(FAST, store="vectorset"))
    await store.start()
    assert not store.available()
    described = store.describe()
    assert described["up"] is False and described["vector_sets"] is False
    assert "vector sets were asked for" in str(described["problem"])
    assert sample(registry, "tiergate_cache_redis_up") == 0
    with pytest.raises(StoreUnavailable, match="vector sets were asked for"):
        await store.get_many("ns", ["x"])
    with pytest.raises(StoreUnavailable):
        await store.put(entry_for("q"), unit(2))


async def test_a_killed_redis_bypasses_at_once_and_is_used_again_after_its_restart(make_store: Make,
                                                                                   redis_server: RedisServer,
                                                                                   redis_url: str) -> None:
    store, registry = make_store(redis_url)
    await store.start()
    e = entry_for("What is a black hole?")
    await store.put(e, unit(4))
    redis_server.stop()
    try:
        with pytest.raises(StoreUnavailable):
            await store.get_many(e.namespace, [e.id])
        assert not store.available() and sample(registry, "tiergate_cache_redis_up") == 0
        with pytest.raises(StoreUnavailable, match="redis is down"):  # no round trip while known down
            await store.put(e, unit(4))
    finally:
        redis_server.start()
    await eventually(store.available, "the store to reconnect")
    assert await store.get_many(e.namespace, [e.id]) == [None]  # a restarted server lost its data
    await store.put(e, unit(4))
    assert (await store.get_many(e.namespace, [e.id]))[0] is not None


async def test_invalidations_reach_one_tenant_or_everything(make_store: Make, redis_url: str) -> None:
    store, _ = make_store(redis_url)
    await store.start()
    mine = [entry_for(f"question {i}?", "acme") for i in range(3)]
    theirs = entry_for("question 0?", "globex")
    for i, e in enumerate([*mine, theirs]):
        await store.put(e, unit(10 + i))
    assert await store.delete_tenant("acme") == 3
    assert await store.get_many(mine[0].namespace, [e.id for e in mine]) == [None] * 3
    assert (await store.get_many(theirs.namespace, [theirs.id]))[0] is not None
    assert await store.delete_all() == 1
    assert await store.get_many(theirs.namespace, [theirs.id]) == [None]


async def test_on_redis_8_an_invalidation_also_reaches_entries_left_by_the_stream_layout(
        make_store: Make, redis8_server: RedisServer) -> None:
    url = flushed(redis8_server)
    old, _ = make_store(url, dataclasses.replace(FAST, store="stream"))
    new, _ = make_store(url)
    await old.start()
    await new.start()
    assert (old.kind, new.kind) == ("redis-stream", "redis-vectorset")
    left, fresh = entry_for("old question?"), entry_for("new question?")
    await old.put(left, unit(20))
    await new.put(fresh, unit(21))
    assert await new.delete(left.id, left.namespace) == 1
    assert await old.get_many(left.namespace, [left.id]) == [None]
    await old.put(left, unit(20))
    assert await new.delete_tenant("acme") == 2
    assert await old.get_many(left.namespace, [left.id]) == [None]
    assert await new.get_many(fresh.namespace, [fresh.id]) == [None]


async def test_admin_start_picks_the_layout_without_background_work(make_store: Make, redis_url: str) -> None:
    store, _ = make_store(redis_url)
    await store.start_admin()
    assert store.available() and store.kind in ("redis-stream", "redis-vectorset")
    e = entry_for("What is a black hole?")
    await store.put(e, unit(30))
    assert await store.delete_all() == 1


async def test_a_cluster_node_given_as_a_plain_url_is_refused_with_the_fix(make_store: Make, redis_cluster) -> None:
    redis_cluster.start()
    store, _ = make_store(f"redis://127.0.0.1:{redis_cluster.nodes[0].port}/0")
    await store.start()
    assert not store.available()
    assert "use redis+cluster://" in str(store.describe()["problem"])
    with pytest.raises(StoreUnavailable, match="redis\\+cluster://"):
        await store.get_many("ns", ["x"])
