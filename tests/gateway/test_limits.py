"""The limiter's failure handling (fakes at the Redis boundary; tests/integration covers real Redis)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import Tenant
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics

pytestmark = pytest.mark.anyio


class _BrokenRedis:
    """Every pipeline fails, as a Redis that is down does; counts how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    def pipeline(self, transaction: bool = False):
        self.asked += 1
        raise ConnectionError("redis is down")


REGISTRY = CollectorRegistry()
METRICS = GatewayMetrics(REGISTRY)


def _fail_open() -> float:
    return REGISTRY.get_sample_value("tiergate_rate_limit_fail_open_total") or 0.0


async def test_after_a_failure_checks_fail_open_without_asking_redis_for_a_while():
    redis = _BrokenRedis()
    now = [100.0]  # the limiter's clock, moved by the test
    limiter = Limiter(METRICS, redis, retry_after_s=0.2, monotonic=lambda: now[0])
    tenant = Tenant(id="acme", requests_per_minute=1)
    before = _fail_open()
    for _ in range(5):  # over its limit, but the count cannot be read: served, counted as failing open
        await limiter.admit(tenant)
    assert redis.asked == 1 and _fail_open() == before + 5
    now[0] += 0.19
    await limiter.admit(tenant)
    assert redis.asked == 1  # still within the pause
    now[0] += 0.02
    await limiter.admit(tenant)
    assert redis.asked == 2  # asked again once the pause is over


async def test_without_redis_the_limits_are_held_in_process():
    limiter = Limiter(METRICS)
    tenant = Tenant(id="acme", requests_per_minute=2)
    await limiter.admit(tenant)
    await limiter.admit(tenant)
    with pytest.raises(OpenAIError) as refused:
        await limiter.admit(tenant)
    assert refused.value.status == 429 and int(refused.value.headers["retry-after"]) >= 1


class _SlowRedis:
    """A reachable but slow Redis: every pipeline answers after a pause, with counts under any limit."""

    def pipeline(self, transaction: bool = False):
        return self

    def incrby(self, *a) -> None: ...

    def expire(self, *a) -> None: ...

    def get(self, *a) -> None: ...

    async def execute(self):
        await asyncio.sleep(0.05)
        return [1, True, None]


async def test_concurrency_limit_holds_while_the_rate_counters_are_read():
    limiter = Limiter(METRICS, _SlowRedis(), timeout_s=1.0)
    tenant = Tenant(id="acme", max_concurrency=1, requests_per_minute=100)
    results = await asyncio.gather(limiter.admit(tenant), limiter.admit(tenant), return_exceptions=True)
    refused = [r for r in results if isinstance(r, OpenAIError)]
    assert len(refused) == 1 and refused[0].code == "concurrency_limit_exceeded"  # not both let in
    limiter.leave(tenant)
    await limiter.admit(tenant)  # the admitted one left: room again
