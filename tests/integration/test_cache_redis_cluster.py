"""The semantic cache and the rate limiter on a real Redis Cluster (three redis-server primaries)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import redis
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from tests.cache.helpers import RULE, SETTINGS, answer, chat, fresh_metrics, sample
from tests.support.servers import free_port
from tests.support.waiting import eventually
from tiergate.cache import CacheSettings, SemanticCache, build_cache
from tiergate.cache.keys import request_key
from tiergate.cache.redis.conn import open_redis
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import Tenant
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

QUESTIONS = [
    "What is the capital of France?", "How tall is Mount Everest?", "Who wrote Hamlet?",
    "What is photosynthesis?", "How do vaccines work?", "Why is the sky blue?", "What is a black hole?",
    "How do I learn Python quickly?", "What causes earthquakes?", "How does a refrigerator work?",
    "What is inflation in economics?", "How do bees make honey?", "What is the speed of sound?",
    "Who painted the Mona Lisa?", "How do airplanes stay in the air?", "What is machine learning?",
    "Why do cats purr?", "How are rainbows formed?", "What is the largest ocean on Earth?",
    "How do I make sourdough bread?",
]


@pytest.fixture
def make_cache(redis_cluster_url, onnx_embedder):
    async def make(settings: CacheSettings | None = None, url: str | None = None):
        metrics, registry = fresh_metrics()
        cache = build_cache(url or redis_cluster_url, None, embedder=onnx_embedder, metrics=metrics,
                            settings=settings or SETTINGS)
        await cache.start()
        return cache, registry

    return make


def keys_per_node(cluster) -> list[int]:
    counts = []
    for node in cluster.nodes:
        client = redis.Redis(port=node.port)
        try:
            counts.append(sum(1 for _ in client.scan_iter(match="{tiergate:cache:*}:e:*", count=1000)))
        finally:
            client.close()
    return counts


LIMIT_REGISTRY = CollectorRegistry()
LIMIT_METRICS = GatewayMetrics(LIMIT_REGISTRY)


def sample_fail_open() -> float:
    return LIMIT_REGISTRY.get_sample_value("tiergate_rate_limit_fail_open_total") or 0.0


async def stop_all(*caches: SemanticCache) -> None:
    for c in caches:
        await c.stop()


async def test_entries_spread_over_the_nodes_and_are_shared(make_cache, redis_cluster):
    a, _ = await make_cache()
    b, reg_b = await make_cache()
    try:
        for i, q in enumerate(QUESTIONS):
            assert await a.store(chat(q), "acme", RULE, answer(f"answer {i}"))
        per_node = keys_per_node(redis_cluster)
        assert sum(per_node) == len(QUESTIONS) and all(n > 0 for n in per_node), per_node

        for i, q in enumerate(QUESTIONS):  # exact: straight from whichever node holds the entry
            hit = await b.lookup(chat(q), "acme", RULE)
            assert hit is not None and hit.kind == "hit-exact" and hit.answer.text == f"answer {i}"
        await eventually(lambda: len(b.index) == len(QUESTIONS), "b's index to follow every shard's stream")
        para = await b.check(chat("How can I learn Python quickly?"), "acme", RULE)
        assert para.status == "hit-semantic" and para.hit.answer.text == "answer 7"
        assert await b.lookup(chat("How can I learn Python quickly?"), "globex", RULE) is None  # other tenant
        assert sample(reg_b, "tiergate_cache_lookups_total", result="hit-exact") == len(QUESTIONS)

        late, _ = await make_cache()  # a gateway started later loads the index from every node
        try:
            assert len(late.index) == len(QUESTIONS)
        finally:
            await late.stop()
    finally:
        await stop_all(a, b)


async def test_size_bound_and_invalidation_across_nodes(make_cache, redis_cluster):
    settings = dataclasses.replace(SETTINGS, max_entries=16, cluster_shards=4)  # 4 per shard
    a, reg_a = await make_cache(settings)
    b, _ = await make_cache(settings)
    try:
        for i, q in enumerate(QUESTIONS):
            await a.store(chat(q), "t1", RULE, answer(f"t1 {i}"))
            await a.store(chat(q), "t2", RULE, answer(f"t2 {i}"))
        stored = sum(keys_per_node(redis_cluster))
        assert stored <= 16 and sample(reg_a, "tiergate_cache_evictions_total") == 2 * len(QUESTIONS) - stored
        await eventually(lambda: len(b.index) == stored, "b's index to drop what was evicted")

        removed = await b.invalidate(tenant="t2")
        assert removed > 0 and sum(keys_per_node(redis_cluster)) == stored - removed
        for q in QUESTIONS:
            assert await a.lookup(chat(q), "t2", RULE) is None
        await eventually(lambda: len(a.index) == stored - removed, "a to drop t2's entries")

        assert await a.invalidate() == stored - removed
        assert keys_per_node(redis_cluster) == [0, 0, 0]
        await eventually(lambda: len(a.index) == 0 and len(b.index) == 0, "both indexes to be empty")
    finally:
        await stop_all(a, b)


async def test_a_node_killed_and_restarted_bypasses_then_recovers(make_cache, redis_cluster):
    a, reg_a = await make_cache()
    statuses: list[str] = []
    reasons: list[str | None] = []
    stop_traffic = asyncio.Event()

    async def traffic() -> None:  # every question, round and round, while a node dies and comes back
        i = 0
        while not stop_traffic.is_set():
            q = chat(QUESTIONS[i % len(QUESTIONS)])
            res = await a.check(q, "acme", RULE)
            statuses.append(res.status)
            if res.status == "bypass":
                reasons.append(res.reason)
            if res.status == "miss":
                await a.store(q, "acme", RULE, answer("again"))
            i += 1
            await asyncio.sleep(0.005)

    runner = asyncio.create_task(traffic())
    try:
        await eventually(lambda: statuses.count("hit-exact") >= 2 * len(QUESTIONS), "traffic to warm the cache")
        redis_cluster.nodes[1].stop()
        await eventually(lambda: statuses[-1] == "bypass" and not a.backend.available(), "the cache to bypass")
        redis_cluster.nodes[1].start()  # same slots, no data: what it held misses, then is stored again
        redis_cluster.wait_ok()
        await eventually(lambda: a.backend.available(), "the cache to reconnect", timeout_s=30)
        mark = len(statuses)
        await eventually(lambda: statuses[mark:].count("hit-exact") >= 2 * len(QUESTIONS),
                         "traffic to hit every question again", timeout_s=30)
        stop_traffic.set()
        await runner  # re-raises anything the traffic saw: there must be nothing
        assert set(statuses) <= {"miss", "hit-exact", "bypass"}
        # `check` never raises: an unexpected error would show up only as a bypass for another reason
        assert reasons and set(reasons) <= {"store_unavailable", "timeout"}, set(reasons)
        assert sample(reg_a, "tiergate_cache_errors_total", op="lookup") == 0
        assert sample(reg_a, "tiergate_cache_redis_up") == 1
    finally:
        stop_traffic.set()
        await asyncio.gather(runner, return_exceptions=True)
        await a.stop()


async def test_a_plain_url_to_a_cluster_node_is_refused_with_a_clear_error(make_cache, redis_cluster):
    with capture_logs() as logs:
        cache, _ = await make_cache(url=f"redis://127.0.0.1:{redis_cluster.nodes[0].port}")
        try:
            assert not cache.backend.available()
            assert (await cache.check(chat("Who wrote Hamlet?"), "acme", RULE)).status == "bypass"
        finally:
            await cache.stop()
    errors = [e for e in logs if e["event"] == "cache_redis_is_a_cluster"]
    assert errors and "redis+cluster://" in errors[0]["fix"]


async def test_rate_limits_are_shared_through_the_cluster(redis_cluster_url):
    tenant = Tenant(id="acme", requests_per_minute=3)
    fail_open_before = sample_fail_open()
    clients = [open_redis(redis_cluster_url, socket_timeout=2, socket_connect_timeout=2) for _ in range(2)]
    try:
        limiters = [Limiter(LIMIT_METRICS, c, timeout_s=2.0) for c in clients]  # two gateway replicas
        for i in range(3):
            await limiters[i % 2].admit(tenant)
        with pytest.raises(OpenAIError) as refused:
            await limiters[1].admit(tenant)
        assert refused.value.status == 429
        await limiters[0].admit(Tenant(id="globex", requests_per_minute=3))  # its own count
        assert sample_fail_open() == fail_open_before  # every check above reached the cluster
    finally:
        for c in clients:
            await c.aclose()



async def _caught_up(cache: SemanticCache) -> bool:
    """The cache's follower has applied every event in every shard's stream (all that was written so far)."""
    layout = cache.backend.layout
    for i, shard in enumerate(layout.shards):
        last = await cache.backend.bg.xrevrange(shard.stream, count=1)
        if last and layout.follower.last_event[i] != last[0][0]:
            return False
    return True


def _question_in_shard(cache: SemanticCache, shard: int, tenant: str = "acme") -> str:
    for n in range(1000):
        q = f"What is item number {n} made of?"
        if cache.backend.layout.shards.index_of(request_key(chat(q), tenant).entry_id) == shard:
            return q
    raise AssertionError(f"no question lands in shard {shard}")


@pytest.mark.parametrize("scope", ["all", "tenant"])
async def test_what_is_stored_right_after_an_invalidation_stays_in_every_index(make_cache, scope):
    a, _ = await make_cache()
    b, _ = await make_cache()
    try:
        for i, q in enumerate(QUESTIONS[:10]):
            await a.store(chat(q), "acme", RULE, answer(f"old {i}"))
        await eventually(lambda: len(b.index) == 10, "b to follow the first entries")
        # Shard 0's stream is read first: if another shard's copy of the invalidation event applied to every
        # entry, it would drop this new one from the indexes again.
        q = _question_in_shard(a, 0)
        removed = await (a.invalidate() if scope == "all" else a.invalidate(tenant="acme"))
        assert removed == 10
        assert await a.store(chat(q), "acme", RULE, answer("new"))
        eid = request_key(chat(q), "acme").entry_id
        await eventually(lambda: eid in b.index and len(b.index) == 1, "b to drop the old and add the new")
        await eventually(lambda: _caught_up(b), "b to have read every shard's stream to its end")
        assert eid in a.index and eid in b.index and len(a.index) == len(b.index) == 1
    finally:
        await stop_all(a, b)


async def test_deployments_sharing_the_cluster_by_prefix_never_touch_each_others_entries(make_cache):
    main, _ = await make_cache()
    eu, _ = await make_cache(dataclasses.replace(SETTINGS, prefix="tiergate:cache:eu"))
    try:
        for i, q in enumerate(QUESTIONS):
            await main.store(chat(q), "acme", RULE, answer(f"main {i}"))
            await eu.store(chat(q), "acme", RULE, answer(f"eu {i}"))
        late, _ = await make_cache()  # loads its own deployment's entries only
        try:
            assert len(late.index) == len(QUESTIONS)
        finally:
            await late.stop()
        assert await main.invalidate(tenant="acme") == len(QUESTIONS)
        for i, q in enumerate(QUESTIONS):
            hit = await eu.lookup(chat(q), "acme", RULE)
            assert hit is not None and hit.answer.text == f"eu {i}"
        assert await main.invalidate() == 0
        assert await eu.invalidate() == len(QUESTIONS)
    finally:
        await stop_all(main, eu)


async def test_an_unreachable_cluster_is_bypassed_from_the_start(make_cache):
    with capture_logs() as logs:
        cache, registry = await make_cache(url=f"redis+cluster://127.0.0.1:{free_port()}")
        try:
            # start() returned because the first attempt failed as a Redis failure, not after its wait ran out
            assert cache.backend.link._ready.is_set() and not cache.backend.available()
            res = await cache.check(chat("Who wrote Hamlet?"), "acme", RULE)
            assert res.status == "bypass" and res.reason == "store_unavailable"
        finally:
            await cache.stop()
    assert not [e for e in logs if e["event"] == "cache_sync_error"]
    assert sample(registry, "tiergate_cache_errors_total", op="sync") == 0


async def test_a_gateway_with_another_shard_count_bypasses_the_cache_and_says_why(make_cache):
    first, _ = await make_cache()  # the default 16 shards, recorded in the cluster
    try:
        with capture_logs() as logs:
            other, _ = await make_cache(dataclasses.replace(SETTINGS, cluster_shards=4))
            try:
                assert first.backend.available() and not other.backend.available()
                assert (await other.check(chat("Who wrote Hamlet?"), "acme", RULE)).status == "bypass"
            finally:
                await other.stop()
        errors = [e for e in logs if e["event"] == "cache_cluster_shards_mismatch"]
        assert errors and errors[0]["in_redis"] == 16 and errors[0]["configured"] == 4
    finally:
        await first.stop()
