"""The semantic cache on real redis-servers: Redis 7 (the stream layout) and Redis 8 (the vector-set layout),
each test against both (`[redis7]`, `[redis8]`). Two caches stand for two gateway processes sharing one Redis."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json

import pytest
import redis
import redis.asyncio
from typer.testing import CliRunner

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tests.support.redis import flushed
from tests.support.waiting import eventually
from tiergate.cache import CacheSettings, SemanticCache, build_cache
from tiergate.cache.redis.stream import StreamLayout
from tiergate.cache.redis.vset import VectorSetLayout
from tiergate.gateway.cache_cli import cache_app

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

EXPECTED_STORE = {"redis7": "redis-stream", "redis8": "redis-vectorset"}


@pytest.fixture
def version(redis_server, request) -> str:
    return request.node.callspec.params["redis_server"]


@pytest.fixture
def make_cache(redis_url, onnx_embedder):
    async def make(settings: CacheSettings | None = None):
        metrics, registry = fresh_metrics()
        cache = build_cache(redis_url, None, embedder=onnx_embedder, metrics=metrics,
                            settings=settings or SETTINGS)
        await cache.start()
        return cache, registry

    return make  # caches are stopped by each test's own event loop (see `stop_all`)


async def stop_all(*caches: SemanticCache) -> None:
    for c in caches:
        await c.stop()


def vectors_in_redis(url: str) -> int:
    """Vectors the Redis 8 layout holds (VCARD over every namespace's vector set)."""
    client = redis.Redis.from_url(url)
    try:
        return sum(int(client.execute_command("VCARD", k)) for k in client.scan_iter(match="tiergate:cache:vs:{*}:v"))
    finally:
        client.close()


async def semantic_hit(cache: SemanticCache, text: str, tenant: str = "acme", rule=RULE) -> bool:
    return (await cache.check(chat(text), tenant, rule)).status == "hit-semantic"


async def test_the_layout_follows_the_server(make_cache, version, redis_url):
    a, reg = await make_cache()
    try:
        assert a.backend.kind == EXPECTED_STORE[version]
        info = a.backend.describe()
        assert info["store"] == EXPECTED_STORE[version] and info["up"] is True
        assert info["vector_sets"] is (version == "redis8")
        assert sample(reg, "tiergate_cache_store", store=EXPECTED_STORE[version]) == 1
    finally:
        await a.stop()


async def test_hits_are_shared_between_two_processes(make_cache):
    a, _ = await make_cache()
    b, reg_b = await make_cache()
    try:
        asked = chat("How do I invest my money wisely?")
        assert await b.lookup(asked, "acme", RULE) is None
        assert await a.store(asked, "acme", RULE, answer("Diversify."))

        exact = await b.lookup(asked, "acme", RULE)  # exact: straight from Redis, no index needed
        assert exact is not None and exact.kind == "hit-exact" and exact.answer.text == "Diversify."

        # Redis 8: searched in Redis, at once; Redis 7: once b's index has followed the stream.
        await eventually(lambda: semantic_hit(b, "How can I invest my money wisely?"), "b to hit semantically")
        para = await b.check(chat("How can I invest my money wisely?"), "acme", RULE)
        assert para.hit.answer.text == "Diversify." and RULE.threshold <= para.hit.similarity < 1.0
        assert para.hit.entry_id == exact.entry_id
        assert sample(reg_b, "tiergate_cache_lookups_total", result="hit-exact") == 1

        guarded = await b.check(chat("How do I invest my money wisely in 2016?"), "acme", RULE)
        assert guarded.status == "miss"
    finally:
        await stop_all(a, b)


async def test_a_process_started_later_hits_at_once(make_cache, version):
    a, _ = await make_cache()
    try:
        await a.store(chat("What are the best places to visit in Mumbai?"), "acme", RULE, answer("Gateway of India."))
        late, reg = await make_cache()
        try:
            if version == "redis8":  # nothing to load: no index in the process, no SCAN
                assert len(late.index) == 0 and sample(reg, "tiergate_cache_index_resyncs_total") == 0
            else:
                assert len(late.index) == 1  # loaded by SCAN at start, not from the stream
            hit = await late.lookup(chat("What are the best places to visit in Mumbai ?"), "acme", RULE)
            assert hit is not None and hit.answer.text == "Gateway of India." and hit.kind == "hit-semantic"
        finally:
            await late.stop()
    finally:
        await a.stop()


async def test_no_hit_ever_crosses_tenants(make_cache):
    a, _ = await make_cache()
    b, _ = await make_cache()
    try:
        q = chat("How do I invest my money wisely?")
        await a.store(q, "tenant-one", RULE, answer("for tenant one"))
        await eventually(lambda: semantic_hit(b, "How can I invest my money wisely?", "tenant-one"), "b to see it")
        for cache in (a, b):
            assert await cache.lookup(q, "tenant-two", RULE) is None
            assert await cache.lookup(chat("How can I invest my money wisely?"), "tenant-two", RULE) is None
            assert (await cache.lookup(q, "tenant-one", RULE)).answer.text == "for tenant one"
    finally:
        await stop_all(a, b)


async def test_entries_expire_with_their_ttl(make_cache, redis_url, version):
    a, _ = await make_cache()
    b, _ = await make_cache()
    try:
        short = dataclasses.replace(RULE, ttl_s=1)
        q = chat("Why is the sky blue?")
        await a.store(q, "acme", short, answer("Rayleigh scattering."))
        assert await b.lookup(q, "acme", short) is not None
        client = redis.Redis.from_url(redis_url)
        try:
            await eventually(lambda: not list(client.scan_iter(match="tiergate:cache:*e:*")),
                             "Redis to expire the entry")
        finally:
            client.close()
        assert await a.lookup(q, "acme", short) is None
        assert await b.lookup(chat("Why is the sky so blue?"), "acme", short) is None
        if version == "redis8":  # the sweeper (or the lookup that found it gone) removes the vector too
            await eventually(lambda: vectors_in_redis(redis_url) == 0, "the expired vector to be removed")
        else:
            await eventually(lambda: len(a.index) == 0 and len(b.index) == 0, "the indexes to drop it")
    finally:
        await stop_all(a, b)


async def test_size_bound_evicts_soonest_expiring_everywhere(make_cache, redis_url, version):
    settings = dataclasses.replace(SETTINGS, max_entries=3)
    a, reg_a = await make_cache(settings)
    b, _ = await make_cache(settings)
    try:
        questions = ["What is the capital of France?", "How tall is Mount Everest?", "Who wrote Hamlet?",
                     "What is photosynthesis?", "How do vaccines work?"]
        for i, q in enumerate(questions):
            rule = dataclasses.replace(RULE, ttl_s=1000 + i)  # later questions expire later
            assert await a.store(chat(q), "acme", rule, answer(f"answer {i}"))
        assert sample(reg_a, "tiergate_cache_evictions_total") == 2
        hits = [await b.lookup(chat(q), "acme", RULE) is not None for q in questions]
        assert hits == [False, False, True, True, True]
        if version == "redis8":
            assert vectors_in_redis(redis_url) == 3  # evicted with their vectors, in the same script
        else:
            await eventually(lambda: len(a.index) == 3 and len(b.index) == 3, "both indexes to hold 3 entries")
    finally:
        await stop_all(a, b)


async def test_one_tenants_flood_evicts_its_own_entries_not_its_peers(make_cache, redis_url, version):
    settings = dataclasses.replace(SETTINGS, max_entries=8)
    a, reg_a = await make_cache(settings)
    b, _ = await make_cache(settings)
    try:
        peer = ["What is the capital of France?", "How tall is Mount Everest?", "Who wrote Hamlet?"]
        for q in peer:  # the oldest entries: a plain soonest-expiring bound would evict them first
            assert await a.store(chat(q), "peer", RULE, answer("peer"))
        for i in range(20):  # from both processes, as two gateways would
            assert await (a, b)[i % 2].store(chat(f"Flood question {i}?"), "flood", RULE, answer("flood"))
        assert sample(reg_a, "tiergate_cache_evictions_total") > 0
        for q in peer:
            assert (await b.check(chat(q), "peer", RULE)).status == "hit-exact"
        flood_hits = [await b.lookup(chat(f"Flood question {i}?"), "flood", RULE) is not None for i in range(20)]
        assert flood_hits == [False] * 15 + [True] * 5  # its newest five: the bound's 8 less the peer's 3
        client = redis.asyncio.Redis.from_url(redis_url)
        try:
            base = "tiergate:cache:vs" if version == "redis8" else "tiergate:cache"
            counts = {k.decode(): int(v) for k, v in await client.zrange(f"{base}:tc", 0, -1, withscores=True)}
            assert sorted(counts.values()) == [3, 5]
            assert await a.invalidate(tenant="flood") == 5
            counts = {k.decode(): int(v) for k, v in await client.zrange(f"{base}:tc", 0, -1, withscores=True)}
            assert list(counts.values()) == [3]
            assert await a.invalidate() == 3
            assert await client.keys(f"{base}:t*") == []
        finally:
            await client.aclose()
    finally:
        await stop_all(a, b)


async def test_invalidation_by_entry_tenant_and_all(make_cache):
    a, reg_a = await make_cache()
    b, _ = await make_cache()
    try:
        q1, q2 = chat("How do I learn Python quickly?"), chat("What is a black hole?")
        for tenant in ("t1", "t2"):
            await a.store(q1, tenant, RULE, answer("q1"))
            await a.store(q2, tenant, RULE, answer("q2"))

        hit = await b.lookup(q1, "t1", RULE)
        assert await b.invalidate(tenant="t2", entry_id=hit.entry_id) == 0  # not t2's entry: untouched
        assert await b.invalidate(entry_id=hit.entry_id) == 1
        assert await a.lookup(q1, "t1", RULE) is None
        assert await a.lookup(q2, "t1", RULE) is not None
        await eventually(lambda: _no_semantic(a, "How can I learn Python quickly?", "t1"), "a to forget it")

        assert await a.invalidate(tenant="t2") == 2
        assert await b.lookup(q1, "t2", RULE) is None and await b.lookup(q2, "t2", RULE) is None
        assert await b.lookup(q2, "t1", RULE) is not None
        await eventually(lambda: _no_semantic(b, "What is a black hole ?", "t2"), "b to forget t2's entries")

        assert await b.invalidate() == 1
        assert await a.lookup(q2, "t1", RULE) is None
        await eventually(lambda: _no_semantic(a, "What is a black hole ?", "t1"), "a to forget everything")
        assert sample(reg_a, "tiergate_cache_invalidated_entries_total", scope="tenant") == 2
    finally:
        await stop_all(a, b)


async def _no_semantic(cache: SemanticCache, text: str, tenant: str) -> bool:
    return (await cache.check(chat(text), tenant, RULE)).status == "miss"


async def test_redis_killed_and_restarted_bypasses_then_recovers(make_cache, redis_server):
    a, reg_a = await make_cache()
    b, _ = await make_cache()
    statuses: list[str] = []
    stop_traffic = asyncio.Event()

    async def traffic() -> None:  # requests keep coming while Redis dies and comes back
        i = 0
        while not stop_traffic.is_set():
            q = chat(f"How do I make sourdough bread number {i % 7}?")
            res = await b.check(q, "acme", RULE)
            statuses.append(res.status)
            if res.status == "miss":
                await b.store(q, "acme", RULE, answer("bread"))
            i += 1
            await asyncio.sleep(0.005)  # pacing, not waiting: the traffic yields to the test between requests

    try:
        q = chat("How do I make sourdough bread?")
        await a.store(q, "acme", RULE, answer("Feed the starter."))
        assert (await b.check(q, "acme", RULE)).status == "hit-exact"
        runner = asyncio.create_task(traffic())

        redis_server.stop()
        for _ in range(20):  # while Redis is dead: never an exception, always a bypass
            res = await a.check(chat("How do I make sourdough bread at home?"), "acme", RULE)
            assert res.status == "bypass" and res.hit is None
            assert await a.store(q, "acme", RULE, answer("x")) is False
        assert sample(reg_a, "tiergate_cache_lookups_total", result="bypass") == 20
        assert sample(reg_a, "tiergate_cache_redis_up") == 0

        redis_server.start()  # a new, empty Redis on the same port
        await eventually(lambda: a.backend.available() and b.backend.available(), "both caches to reconnect")
        assert (await a.check(q, "acme", RULE)).status == "miss"  # the restarted Redis is empty
        await a.store(q, "acme", RULE, answer("Again."))
        res = await b.check(chat("How do I make sourdough bread?"), "acme", RULE)
        assert res.status == "hit-exact" and res.hit.answer.text == "Again."
        await eventually(lambda: semantic_hit(b, "How do I make sourdough bread ?"), "semantic hits to come back")
        await eventually(lambda: statuses[-1] == "hit-exact", "traffic to hit the cache again")
        stop_traffic.set()
        await runner  # re-raises anything the traffic saw: there must be nothing
        assert "bypass" in statuses and set(statuses) <= {"miss", "hit-exact", "hit-semantic", "bypass"}
    finally:
        stop_traffic.set()
        await stop_all(a, b)


@dataclasses.dataclass(frozen=True)
class AnyRedis:
    """One redis-server (7 or 8) or a three-node Redis 7 Cluster: its URL and its servers."""
    url: str
    servers: list

    def entries(self) -> int:
        total = 0
        for server in self.servers:
            client = redis.Redis(port=server.port)
            try:
                total += sum(1 for k in client.scan_iter(count=1000) if b":e:" in k)
            finally:
                client.close()
        return total


@pytest.fixture(params=["redis7", "redis8", "cluster"])
def any_redis(request) -> AnyRedis:
    if request.param == "cluster":
        return AnyRedis(request.getfixturevalue("redis_cluster_url"), request.getfixturevalue("redis_cluster").nodes)
    server = request.getfixturevalue(f"{request.param}_server")
    return AnyRedis(flushed(server), [server])


async def test_hung_redis_is_bypassed_within_the_timeout(any_redis, onnx_embedder):
    metrics, reg_a = fresh_metrics()
    a = build_cache(any_redis.url, None, embedder=onnx_embedder, metrics=metrics,
                    settings=dataclasses.replace(SETTINGS, redis_timeout_s=0.3))
    await a.start()
    try:
        q = chat("What is the speed of light?")
        await a.store(q, "acme", RULE, answer("c"))
        for server in any_redis.servers:  # every server hangs: connections open, no answers, until resumed
            server.pause()
        try:
            res = await a.check(q, "acme", RULE)  # returns although Redis cannot answer: bounded by the timeout
            assert res.status == "bypass"
        finally:
            for server in any_redis.servers:
                server.resume()
        await eventually(lambda: a.backend.available(), "the cache to see Redis answer again", timeout_s=60)
        await eventually(lambda: _status_is(a, q, "hit-exact"), "the entry to be hit again", timeout_s=60)
        assert sample(reg_a, "tiergate_cache_lookups_total", result="bypass") >= 1
    finally:
        await a.stop()


async def _status_is(cache: SemanticCache, q, status: str) -> bool:
    return (await cache.check(q, "acme", RULE)).status == status


async def test_a_gateway_starts_while_redis_is_down_and_catches_up(redis_server, onnx_embedder):
    redis_server.stop()
    metrics, _ = fresh_metrics()
    cache = build_cache(redis_server.url, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS)
    try:
        await cache.start()  # returns after the first failed attempt, not after a long wait
        q = chat("What is the tallest mountain?")
        assert (await cache.check(q, "acme", RULE)).status == "bypass"
        assert await cache.store(q, "acme", RULE, answer("Everest")) is False
        assert cache.backend.describe()["up"] is False
        redis_server.start()
        await eventually(lambda: cache.backend.available(), "the cache to connect")
        assert await cache.store(q, "acme", RULE, answer("Everest"))
        assert (await cache.check(q, "acme", RULE)).status == "hit-exact"
    finally:
        await cache.stop()
        redis_server.start()


def test_cli_invalidate_against_redis(any_redis, onnx_embedder):
    url, entries = any_redis.url, any_redis.entries
    questions = ["What is Redis?", "What is a hash slot?", "Who wrote Hamlet?", "What is a black hole?"]

    async def fill() -> None:
        metrics, _ = fresh_metrics()
        cache = build_cache(url, None, embedder=onnx_embedder, metrics=metrics, settings=SETTINGS)
        await cache.start()
        try:
            for tenant in ("t1", "t2"):
                for q in questions:
                    assert await cache.store(chat(q), tenant, RULE, answer("A server."))
        finally:
            await cache.stop()

    asyncio.run(fill())
    assert entries() == 8
    runner = CliRunner()
    res = runner.invoke(cache_app, ["invalidate", "--tenant", "t1", "--redis", url])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"ok": True, "removed": 4}
    res = runner.invoke(cache_app, ["invalidate", "--all", "--redis", url])
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"ok": True, "removed": 4}
    assert entries() == 0


async def test_stop_ends_the_background_task_even_if_a_client_call_swallows_the_cancellation(make_cache, version,
                                                                                             monkeypatch):
    async def stubborn_run(self) -> None:
        while self._c.up and not self._c.stopping:
            # what a client library that catches too much (or 3.11's wait_for race) looks like
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.05)

    monkeypatch.setattr(VectorSetLayout if version == "redis8" else StreamLayout, "run", stubborn_run)
    cache, _ = await make_cache()
    task = cache.backend.link._task
    assert task is not None and not task.done()
    await cache.stop()
    assert task.done()  # ended within stop's bound, not left looping for the event loop's shutdown to hang on
