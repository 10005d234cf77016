"""The link to Redis on real servers: a store choice it does not know is refused, a dead Redis does not hold up
the start, slow answers bypass one request until three in a row mark Redis down, and an admin start picks a
layout with no background work. (Which layout it picks: seen through the store, tests/cache/redis/test_store.py.)"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest
from prometheus_client import CollectorRegistry

from tests.cache.helpers import SETTINGS, fresh_metrics, sample
from tests.support.ports import free_port
from tests.support.redis import RedisServer, flushed
from tests.support.tools import require_tool
from tests.support.waiting import eventually
from tiergate.cache.index import VectorIndex
from tiergate.cache.redis.link import RedisLink
from tiergate.cache.settings import CacheSettings
from tiergate.cache.store import StoreUnavailable

pytestmark = pytest.mark.anyio

FAST = dataclasses.replace(SETTINGS, retry_every_s=0.05)
Make = Callable[..., tuple[RedisLink, CollectorRegistry]]


@pytest.fixture
async def make_link() -> AsyncIterator[Make]:
    links: list[RedisLink] = []

    def make(url: str, settings: CacheSettings = FAST) -> tuple[RedisLink, CollectorRegistry]:
        metrics, registry = fresh_metrics()
        link = RedisLink(url, VectorIndex(8), settings, metrics)
        links.append(link)
        return link, registry

    yield make
    for link in links:
        await link.stop()


def test_an_unknown_store_choice_is_refused() -> None:
    with pytest.raises(ValueError, match="choose auto, vectorset or stream"):
        RedisLink("redis://127.0.0.1:1/0", VectorIndex(8), dataclasses.replace(SETTINGS, store="faiss"),
                  fresh_metrics()[0])


async def test_a_dead_redis_does_not_hold_up_the_start_and_is_used_once_it_answers(make_link: Make,
                                                                                   tmp_path) -> None:
    server = RedisServer(require_tool("redis-server", "apt-get install -y redis-server"), tmp_path / "late", free_port())
    link, registry = make_link(server.url)
    try:
        await link.start(wait_s=30)  # returns after the first failed attempt, not after 30 s
        assert not link.up
        with pytest.raises(StoreUnavailable, match="redis is down"):
            link.active()
        server.start()
        await eventually(lambda: link.up, "the link to see Redis answer")
        assert sample(registry, "tiergate_cache_redis_up") == 1
        assert link.active().kind in ("redis-stream", "redis-vectorset")
        assert await link.call(lambda: link.r.ping())
    finally:
        server.stop()


async def test_one_slow_answer_bypasses_one_request_and_three_in_a_row_mark_redis_down(
        make_link: Make, redis7_server: RedisServer) -> None:
    link, registry = make_link(flushed(redis7_server), dataclasses.replace(FAST, redis_timeout_s=0.2))
    await link.start()
    redis7_server.pause()
    try:
        for _ in range(2):
            with pytest.raises(StoreUnavailable, match="timed out"):
                await link.call(lambda: link.r.get("k"))
            assert link.up
        with pytest.raises(StoreUnavailable, match="timed out"):
            await link.call(lambda: link.r.get("k"))
        assert not link.up and sample(registry, "tiergate_cache_redis_up") == 0
        with pytest.raises(StoreUnavailable, match="redis is down"):  # no round trip while known down
            await link.call(lambda: link.r.get("k"))
    finally:
        redis7_server.resume()
    await eventually(lambda: link.up, "the link to see Redis answer again")


async def test_a_good_answer_between_slow_ones_starts_the_count_again(make_link: Make,
                                                                      redis7_server: RedisServer) -> None:
    link, _ = make_link(flushed(redis7_server), dataclasses.replace(FAST, redis_timeout_s=0.2))
    await link.start()
    for _ in range(3):
        redis7_server.pause()
        try:
            for _ in range(2):
                with pytest.raises(StoreUnavailable, match="timed out"):
                    await link.call(lambda: link.r.get("k"))
        finally:
            redis7_server.resume()
        assert await link.call(lambda: link.r.get("k")) is None
    assert link.up


async def test_admin_start_picks_the_layout_without_background_work(make_link: Make, redis_url: str) -> None:
    link, _ = make_link(redis_url)
    await link.start_admin()
    assert link.up and link.active().kind in ("redis-stream", "redis-vectorset")
    assert link._task is None
