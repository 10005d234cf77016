"""The limiter on real Redis (7 and 8, and a three-node Cluster): two replicas share one window, a check and its
increment are one step, refusals count nothing, reservations settle to what was used."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tiergate.cache.redis.conn import open_redis
from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import Tenant
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics

pytestmark = [pytest.mark.integration, pytest.mark.anyio, pytest.mark.timeout(120)]


def _replicas(url: str, n: int = 2) -> list[Limiter]:
    """`n` gateways' limiters, each with its own client, as separate replicas have."""
    return [Limiter(GatewayMetrics(CollectorRegistry()), open_redis(url), timeout_s=5.0) for _ in range(n)]


async def _twenty_reservations(limiters: list[Limiter], tenant: Tenant) -> tuple[list, list[OpenAIError]]:
    got = await asyncio.gather(*(limiters[i % len(limiters)].reserve(tenant, 15) for i in range(20)),
                               return_exceptions=True)
    for r in got:
        if isinstance(r, BaseException) and not isinstance(r, OpenAIError):
            raise r
    return [r for r in got if not isinstance(r, BaseException)], [r for r in got if isinstance(r, OpenAIError)]


async def _check(url: str) -> None:
    a, b = limiters = _replicas(url)
    tenant = Tenant(id="acme", tokens_per_minute=50, requests_per_minute=3)
    admitted, refused = await _twenty_reservations(limiters, tenant)
    assert len(admitted) == 3 and len(refused) == 17  # across both replicas: 3 × 15 ≤ 50 < 4 × 15
    for reservation in admitted:
        await (a if reservation is admitted[0] else b).settle(reservation, 5)
    assert await b.reserve(tenant, 30) is not None  # 15 used after settling: 30 more fit
    for _ in range(3):
        await a.admit(tenant)
    for limiter in (a, b, a, b):  # refused, and refusals are not counted: the window stays at 3
        with pytest.raises(OpenAIError) as over:
            await limiter.admit(tenant)
        assert over.value.code == "rate_limit_exceeded"
        assert over.value.headers["x-ratelimit-remaining-requests"] == "0"
    for limiter in limiters:
        assert (limiter._metrics.fail_open._value.get()) == 0


async def test_two_replicas_share_one_window_on_redis(redis_url):
    await _check(redis_url)


async def test_two_replicas_share_one_window_on_a_redis_cluster(redis_cluster_url):
    await _check(redis_cluster_url)
