"""EdgePool: the gateway's registry of edge nodes (in process and in Redis) and least-loaded selection."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from structlog.testing import capture_logs

from tests.support.servers import aiohttp_server
from tiergate.cache.redis.conn import open_redis
from tiergate.core.pool import Pool
from tiergate.gateway.pools.edge import EdgePool, HeartbeatError, NodeOwned, parse_heartbeat


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def hb(node_id: str, busy: int = 0, slots: int = 4, queued: int = 0, port: int = 9000) -> dict:
    return {"node_id": node_id, "url": f"http://10.0.0.1:{port}", "model": "edge-model", "slots": slots,
            "busy": busy, "queued": queued, "ctx": 2048}


def ids(eps) -> list[str]:
    return [e.id for e in eps]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def run(coro):
    return asyncio.run(coro)


def test_implements_the_gateway_pool_protocol():
    assert isinstance(EdgePool("edge", [], "m"), Pool)


def test_heartbeat_registers_a_node_with_its_url_model_and_slots(clock):
    pool = EdgePool("edge", [], "tiergate-edge", clock=clock)
    ep = run(pool.heartbeat(hb("a", busy=1)))
    assert (ep.id, ep.base_url, ep.model, ep.slots, ep.tier) == ("a", "http://10.0.0.1:9000", "edge-model", 4, "edge")
    assert ep.reported_load == pytest.approx(0.25)
    assert ids(pool.candidates()) == ["a"] and pool.healthy()


def test_a_heartbeat_carries_the_nodes_throughput_for_live_prices(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    ep = run(pool.heartbeat({**hb("a"), "tokens_per_s": 42.5}))
    assert ep.extra["tokens_per_s"] == 42.5
    assert run(pool.heartbeat(hb("old"))).extra["tokens_per_s"] == 0.0  # a node that does not say: no reading


def test_candidates_are_ordered_least_loaded_first(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    run(pool.heartbeat(hb("busy", busy=3)))
    run(pool.heartbeat(hb("idle", busy=0)))
    run(pool.heartbeat(hb("queued", busy=4, queued=2)))
    assert ids(pool.candidates()) == ["idle", "busy", "queued"]


def test_own_inflight_counts_even_before_the_next_heartbeat(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    a = run(pool.heartbeat(hb("a", busy=1)))
    run(pool.heartbeat(hb("b", busy=1)))
    a.inflight = 3  # dispatch opened three requests on a since its last heartbeat
    assert ids(pool.candidates()) == ["b", "a"]


def test_equal_loads_rotate(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    for n in ("a", "b", "c"):
        run(pool.heartbeat(hb(n)))
    firsts = {pool.candidates()[0].id for _ in range(3)}
    assert firsts == {"a", "b", "c"}


def test_silent_nodes_expire_after_ttl(clock):
    pool = EdgePool("edge", [], "m", ttl_s=10, clock=clock)
    run(pool.heartbeat(hb("old")))
    clock.t += 6
    run(pool.heartbeat(hb("new")))
    clock.t += 5  # old silent for 11 s, new for 5 s
    assert ids(pool.candidates()) == ["new"]
    run(pool.refresh())
    assert ids(pool.endpoints()) == ["new"]


def test_heartbeat_updates_load_in_place(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    a = run(pool.heartbeat(hb("a", busy=0)))
    a.inflight = 1
    a2 = run(pool.heartbeat(hb("a", busy=4)))
    assert a2 is a and a.inflight == 1 and a.reported_load == 1.0


def test_deregister_removes_at_once(clock):
    pool = EdgePool("edge", [], "m", clock=clock)
    run(pool.heartbeat(hb("a")))
    assert run(pool.deregister("a")) is True
    assert pool.candidates() == [] and not pool.healthy()
    assert run(pool.deregister("a")) is False


def test_failures_cool_an_endpoint_down_and_success_restores_it(clock):
    pool = EdgePool("edge", [], "m", clock=clock, failure_threshold=2)
    a = run(pool.heartbeat(hb("a")))
    run(pool.heartbeat(hb("b", busy=3)))
    pool.report(a, False)
    assert ids(pool.candidates()) == ["a", "b"]  # one failure is not enough
    pool.report(a, False)
    assert ids(pool.candidates()) == ["b"]
    pool.report(a, True)
    assert ids(pool.candidates()) == ["a", "b"]


@pytest.mark.parametrize(
    "body",
    [
        {"url": "http://x:1", "model": "m"},
        {"node_id": "a", "url": "ftp://x", "model": "m"},
        {"node_id": "a", "url": "http://x:1", "model": "m", "slots": 0},
        {"node_id": "a", "url": "http://x:1", "model": "m", "busy": "lots"},
        {"node_id": "a", "url": "http://x:1", "model": "m", "tokens_per_s": -1},
        {"node_id": "a", "url": "http://x:1", "model": "m", "tokens_per_s": 1e300},
        b'{"node_id": "a", "url": "http://x:1", "model": "m", "tokens_per_s": NaN}',
        b"not json",
    ],
)
def test_malformed_heartbeats_are_refused(body):
    with pytest.raises(HeartbeatError):
        parse_heartbeat(body)


def test_heartbeat_accepts_raw_json_and_ignores_unknown_fields():
    info = parse_heartbeat(b'{"node_id":"a","url":"http://h:1/v1","model":"m","slots":2,"extra":true}')
    assert info.node_id == "a" and info.slots == 2


def test_static_endpoint_learns_model_slots_and_load_from_health():
    health = {"status": "ok", "model": "real-name", "slots": 8, "busy": 6, "queued": 0, "ctx": 1024}

    async def handler(_request):
        return web.json_response(health)

    app = web.Application()
    app.router.add_get("/health", handler)
    with aiohttp_server(app) as srv:

        async def scenario():
            pool = EdgePool("edge", [srv.url + "/v1", "http://127.0.0.1:1"], "fallback-name", poll_interval_s=0.1)
            await pool.start()
            try:
                for _ in range(100):
                    ep = pool.endpoints()[0]
                    if ep.model == "real-name" and not pool.endpoints()[1].extra["up"]:
                        break
                    await asyncio.sleep(0.05)
                return pool, [(e.id, e.model, e.slots, e.reported_load) for e in pool.candidates()]
            finally:
                await pool.stop()

        _, cands = asyncio.run(scenario())
    assert cands == [(srv.url, "real-name", 8, 0.75)]  # the unreachable one is excluded


# ---------------------------------------------------------------- Redis: every replica sees every node


@pytest.fixture(params=["server", "cluster"])
def redis_url(request) -> str:
    """One redis-server, then a three-node Redis Cluster (tests/support/redis.py)."""
    return request.getfixturevalue("redis_url" if request.param == "server" else "redis_cluster_url")


@pytest.mark.integration
def test_replicas_share_the_registry_through_redis(redis_url, clock):
    async def scenario():
        r1, r2 = open_redis(redis_url), open_redis(redis_url)
        prefix = "test-edge-share"
        a = EdgePool("edge", [], "m", redis=r1, ttl_s=10, clock=clock, key_prefix=prefix)
        b = EdgePool("edge", [], "m", redis=r2, ttl_s=10, clock=clock, key_prefix=prefix)
        try:
            await a.heartbeat(hb("n1", busy=2))
            await a.heartbeat(hb("n2", busy=0, port=9001))
            await b.refresh()
            seen_by_b = [(e.id, e.base_url, e.reported_load) for e in b.candidates()]
            await b.deregister("n2")
            await a.refresh()
            after_deregister = ids(a.candidates())
            clock.t += 11  # n1 goes silent past the TTL
            await b.heartbeat(hb("n3"))
            await a.refresh()
            after_expiry = ids(a.endpoints())
            leftover = await r1.hkeys(f"{{{prefix}:edge}}:info")
            return seen_by_b, after_deregister, after_expiry, sorted(k.decode() for k in leftover)
        finally:
            await r1.delete(*(f"{{{prefix}:edge}}:{k}" for k in ("seen", "info", "gone", "owner")))
            await r1.aclose()
            await r2.aclose()

    seen_by_b, after_deregister, after_expiry, leftover = asyncio.run(scenario())
    assert seen_by_b == [("n2", "http://10.0.0.1:9001", 0.0), ("n1", "http://10.0.0.1:9000", 0.5)]
    assert after_deregister == ["n1"]
    assert after_expiry == ["n3"] and leftover == ["n3"]


@pytest.mark.integration
def test_a_node_leaving_through_one_replica_leaves_them_all_but_lost_data_does_not(redis_url, clock):
    prefix = "test-edge-last"
    keys = [f"{{{prefix}:edge}}:{k}" for k in ("seen", "info", "gone", "owner")]

    async def scenario():
        r1, r2 = open_redis(redis_url), open_redis(redis_url)
        a = EdgePool("edge", [], "m", redis=r1, ttl_s=10, clock=clock, key_prefix=prefix)
        b = EdgePool("edge", [], "m", redis=r2, ttl_s=10, clock=clock, key_prefix=prefix)
        try:
            await a.heartbeat(hb("only"))
            await b.refresh()
            known_by_b = ids(b.candidates())
            await a.deregister("only")  # the tier's only node drains, through replica a
            await b.refresh()
            after_deregister = ids(b.candidates())
            await a.heartbeat(hb("n2"))
            await a.heartbeat(hb("n3", port=9001))
            await b.refresh()
            await r1.delete(*keys)  # what a Redis restart without persistence looks like ...
            await b.refresh()
            after_data_loss = ids(b.candidates())
            await a.heartbeat(hb("n3", port=9001))  # ... then one node's heartbeat refills Redis first
            await b.refresh()
            after_partial_refill = ids(b.candidates())
            return known_by_b, after_deregister, after_data_loss, after_partial_refill
        finally:
            await r1.delete(*keys)
            await r1.aclose()
            await r2.aclose()

    known_by_b, after_deregister, after_data_loss, after_partial_refill = asyncio.run(scenario())
    assert known_by_b == ["only"] and after_deregister == []
    assert sorted(after_data_loss) == ["n2", "n3"]  # kept until their TTL: their next heartbeats refill Redis
    assert sorted(after_partial_refill) == ["n2", "n3"]  # n2 has not sent one yet: still kept


@pytest.mark.integration
def test_redis_outage_keeps_the_local_view(clock):
    async def scenario():
        dead = aioredis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.2)
        pool = EdgePool("edge", [], "m", redis=dead, clock=clock)
        await pool.heartbeat(hb("a"))
        await pool.refresh()
        await dead.aclose()
        return ids(pool.candidates())

    assert asyncio.run(scenario()) == ["a"]


def test_a_node_serving_less_context_than_the_tier_promises_is_warned_about_when_it_registers(clock):
    pool = EdgePool("edge", [], "m", clock=clock, max_context=4096)
    with capture_logs() as logs:
        run(pool.heartbeat(hb("small") | {"ctx": 1024}))
        run(pool.heartbeat(hb("small") | {"ctx": 1024}))  # once per value, not per heartbeat
        run(pool.heartbeat(hb("big") | {"ctx": 8192}))
    warned = [e for e in logs if e["event"] == "tier_context_larger_than_server"]
    assert [(e["endpoint"], e["server_context"], e["max_context"]) for e in warned] == [("small", 1024, 4096)]


# ---- ownership: a node id is refreshed, replaced or removed only by whoever registered it (issue 39) ----------

def test_a_registration_is_refreshed_replaced_or_removed_only_by_its_owner(clock):
    pool = EdgePool("edge", [], "m", ttl_s=10, clock=clock)
    run(pool.heartbeat(hb("a", busy=1), owner="claim:node"))
    for attempt in (pool.heartbeat(hb("a", port=6666), owner="claim:rogue"),  # replace (another URL)
                    pool.heartbeat(hb("a", busy=0), owner="claim:rogue"),  # refresh (a fake load reading)
                    pool.deregister("a", owner="claim:rogue")):  # remove
        with pytest.raises(NodeOwned, match="registered by another node"):
            run(attempt)
    (ep,) = pool.endpoints()
    assert (ep.base_url, ep.reported_load) == ("http://10.0.0.1:9000", 0.25)
    run(pool.heartbeat(hb("a", busy=2), owner="claim:node"))  # its owner refreshes it
    assert ep.reported_load == 0.5
    clock.t += 5
    run(pool.heartbeat(hb("a", port=7777), owner="node-key", authoritative=True))  # its own key takes it over
    assert ep.base_url == "http://10.0.0.1:7777" and pool.registry.owners["a"] == "node-key"
    with pytest.raises(NodeOwned):
        run(pool.heartbeat(hb("a"), owner="claim:node"))
    clock.t += 11  # silent past the TTL: the id is free again
    run(pool.heartbeat(hb("a", port=8888), owner="claim:later"))
    assert run(pool.deregister("a", owner="claim:later")) is True and pool.endpoints() == []


@pytest.mark.integration
def test_ownership_holds_on_every_replica_and_through_lost_redis_data(redis_url, clock):
    prefix = "test-edge-owner"
    keys = [f"{{{prefix}:edge}}:{k}" for k in ("seen", "info", "gone", "owner")]

    async def scenario():
        r1, r2 = open_redis(redis_url), open_redis(redis_url)
        a = EdgePool("edge", [], "m", redis=r1, ttl_s=10, clock=clock, key_prefix=prefix)
        b = EdgePool("edge", [], "m", redis=r2, ttl_s=10, clock=clock, key_prefix=prefix)
        refused = []
        try:
            await a.heartbeat(hb("n1"), owner="claim:node")
            for attempt in (b.heartbeat(hb("n1", port=6666), owner="claim:rogue"),  # b has not even heard of n1
                            b.deregister("n1", owner="claim:rogue")):
                try:
                    await attempt
                except NodeOwned:
                    refused.append("redis")
            await b.refresh()
            await r1.delete(*keys)  # Redis restarts empty: b still knows who holds n1
            try:
                await b.heartbeat(hb("n1", port=6666), owner="claim:rogue")
            except NodeOwned:
                refused.append("local")
            await b.heartbeat(hb("n1"), owner="claim:node")  # the owner refills it through b
            await b.heartbeat(hb("n1", port=7777), owner="node-key", authoritative=True)  # its key takes it over
            await a.refresh()
            (ep,) = a.endpoints()
            return refused, ep.base_url, a.registry.owners["n1"]
        finally:
            await r1.delete(*keys)
            await r1.aclose()
            await r2.aclose()

    refused, url, owner = asyncio.run(scenario())
    assert refused == ["redis", "redis", "local"]
    assert (url, owner) == ("http://10.0.0.1:7777", "node-key")


@pytest.mark.integration
def test_while_redis_is_away_the_local_view_still_refuses_another_owner(clock):
    async def scenario():
        dead = aioredis.from_url("redis://127.0.0.1:1", socket_connect_timeout=0.2)
        pool = EdgePool("edge", [], "m", redis=dead, clock=clock)
        await pool.heartbeat(hb("a"), owner="claim:node")
        try:
            await pool.heartbeat(hb("a", port=6666), owner="claim:rogue")
        except NodeOwned:
            return [e.base_url for e in pool.endpoints()]
        finally:
            await dead.aclose()
        return None

    assert asyncio.run(scenario()) == ["http://10.0.0.1:9000"]
