"""`gateway.quarantine`: a fingerprint held until it expires, here and (with Redis) on every replica."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.redis import flushed
from tiergate.cache.redis.conn import open_redis
from tiergate.gateway.quarantine import Quarantine, quarantined


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_a_fingerprint_is_held_until_it_expires_and_nothing_else_is() -> None:
    clock = _Clock()
    q = Quarantine(ttl_s=600, clock=clock)
    assert not q.active()
    asyncio.run(q.add("fp"))
    assert q.active() and q.holds("fp") and not q.holds("other")
    clock.now += 599
    assert q.holds("fp")
    clock.now += 2
    assert not q.holds("fp") and not q.active()


def test_the_refusal_says_why_and_is_not_worth_retrying() -> None:
    error = quarantined(600)
    assert error.status == 400 and error.code == "request_quarantined" and "10 minutes" in error.message


@pytest.mark.integration
def test_every_replica_refuses_what_one_quarantined(redis7_server) -> None:
    """Two replicas on one Redis: what the first quarantines, the second holds after its next refresh; expired
    entries leave Redis."""
    url = flushed(redis7_server)

    async def run() -> tuple[bool, bool, bool]:
        clock = _Clock()
        a = Quarantine(open_redis(url), ttl_s=60, clock=clock)
        b = Quarantine(open_redis(url), ttl_s=60, clock=clock)
        await a.add("poison")
        before = b.holds("poison")
        await b.refresh()
        shared = b.holds("poison")
        clock.now += 61
        await b.refresh()
        return before, shared, b.holds("poison") or bool(await open_redis(url).zcard("tg:quarantine"))

    before, shared, after_expiry = asyncio.run(run())
    assert (before, shared, after_expiry) == (False, True, False)
