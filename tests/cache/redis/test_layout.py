"""The contract between the Redis link and its layouts: both layouts offer every method the link and store call,
the link offers everything a layout may use, and what real Redis clients raise when Redis fails is among the
`FAILURES` the store turns into a bypass (a layout lets them propagate)."""

from __future__ import annotations

import inspect

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.cache.helpers import fresh_metrics
from tests.support.ports import free_port
from tests.support.redis import RedisServer
from tiergate.cache.index import VectorIndex
from tiergate.cache.redis.conn import open_redis
from tiergate.cache.redis.layout import FAILURES, Conn, Layout, Misconfigured
from tiergate.cache.redis.link import RedisLink
from tiergate.cache.redis.stream import StreamLayout
from tiergate.cache.redis.vset import VectorSetLayout
from tiergate.cache.settings import CacheSettings

pytestmark = pytest.mark.anyio

NO_RETRY = Retry(NoBackoff(), 0)  # as the store's clients: a failure surfaces at once


def members(protocol: type) -> dict[str, object]:
    names = set(getattr(protocol, "__annotations__", {})) | {
        n for n, v in vars(protocol).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return {n: getattr(protocol, n, None) for n in names}


def params(fn: object) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize(("layout", "kind"), [(StreamLayout, "redis-stream"), (VectorSetLayout, "redis-vectorset")])
def test_each_layout_offers_every_method_the_store_calls_with_the_same_parameters(layout, kind) -> None:
    assert layout.kind == kind
    for name, declared in members(Layout).items():
        assert hasattr(layout, name), f"{layout.__name__} lacks {name}"
        if callable(declared):
            ours = getattr(layout, name)
            assert params(ours) == params(declared), name
            assert inspect.iscoroutinefunction(ours) == inspect.iscoroutinefunction(declared), name


def test_the_link_offers_everything_a_layout_may_use() -> None:
    link = RedisLink("redis://127.0.0.1:1/0", VectorIndex(4), CacheSettings(), fresh_metrics()[0])
    for name, declared in members(Conn).items():
        assert hasattr(link, name), f"RedisLink lacks {name}"
        if callable(declared):
            assert params(getattr(RedisLink, name)) == params(declared), name
            assert inspect.iscoroutinefunction(getattr(RedisLink, name)), name
    assert isinstance(link.up, bool) and isinstance(link.stopping, bool)


def test_a_misconfigured_server_is_a_redis_failure_too() -> None:
    assert isinstance(Misconfigured("no vector sets"), FAILURES)


async def test_a_refused_connection_is_a_failure() -> None:
    client = Redis(port=free_port(), socket_connect_timeout=1, retry=NO_RETRY)
    try:
        with pytest.raises(FAILURES):
            await client.ping()
    finally:
        await client.aclose()


async def test_a_hung_server_is_a_failure(redis7_server: RedisServer) -> None:
    redis7_server.start()
    client = Redis(port=redis7_server.port, socket_timeout=0.2, socket_connect_timeout=0.2, retry=NO_RETRY)
    try:
        await client.ping()
        redis7_server.pause()
        with pytest.raises(FAILURES):
            await client.get("k")
    finally:
        redis7_server.resume()
        await client.aclose()


async def test_a_cluster_with_no_reachable_node_is_a_failure() -> None:
    client = open_redis(f"redis+cluster://127.0.0.1:{free_port()}", socket_connect_timeout=0.5)
    try:
        with pytest.raises(FAILURES):
            await client.get("k")
    finally:
        await client.aclose()


async def test_a_layout_error_reply_is_a_failure(redis8_server: RedisServer) -> None:
    redis8_server.start()
    client = Redis(port=redis8_server.port)
    try:
        await client.set("s", "1")
        with pytest.raises(FAILURES):
            await client.execute_command("VCARD", "s")  # WRONGTYPE
    finally:
        await client.aclose()
