"""The limiter: what it admits and refuses, what a refusal says, reservations settled to the truth, and Redis
failures (fakes at the Redis boundary; tests/integration/test_limits_redis.py runs the same against real Redis)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from tiergate.core.errors import OpenAIError
from tiergate.gateway.auth import Tenant
from tiergate.gateway.limits import Limiter, rate_headers
from tiergate.gateway.metrics import GatewayMetrics

pytestmark = pytest.mark.anyio

REGISTRY = CollectorRegistry()
METRICS = GatewayMetrics(REGISTRY)


class Clock:
    """Wall time as the limiter reads it, moved by the test; starts 30 s into a minute."""

    def __init__(self, now: float = 6_000_030.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _fail_open() -> float:
    return REGISTRY.get_sample_value("tiergate_rate_limit_fail_open_total") or 0.0


async def _refusal(call) -> OpenAIError:
    with pytest.raises(OpenAIError) as refused:
        await call
    return refused.value


async def test_a_refused_request_counts_nothing_and_its_retry_after_is_when_a_retry_is_admitted():
    """Two requests a minute, both used in the previous minute's last seconds: a third one now is refused, and the
    wait it is told is the wait that works — not the fixed bucket's reset, and not prolonged by the refusals."""
    clock = Clock(6_000_058.0)  # 58 s into a minute
    limiter = Limiter(METRICS, clock=clock)
    tenant = Tenant(id="acme", requests_per_minute=2)
    await limiter.admit(tenant)
    await limiter.admit(tenant)
    clock.now += 4  # 2 s into the next minute: the window still counts most of the previous one
    refused = await _refusal(limiter.admit(tenant))
    wait = int(refused.headers["retry-after"])
    assert refused.status == 429 and refused.type == "rate_limit_error" and 1 <= wait <= 60
    for _ in range(5):  # retrying early is refused and, refused, adds nothing
        clock.now += (wait - 1) / 5
        await _refusal(limiter.admit(tenant))
    clock.now = 6_000_062.0 + wait
    await limiter.admit(tenant)  # admitted exactly when it was told


async def test_concurrent_reservations_cannot_overshoot_a_token_limit_and_settle_to_what_was_used():
    clock = Clock()
    limiter = Limiter(METRICS, clock=clock)
    tenant = Tenant(id="acme", tokens_per_minute=50)
    got = await asyncio.gather(*(limiter.reserve(tenant, 15) for _ in range(20)), return_exceptions=True)
    admitted = [r for r in got if not isinstance(r, BaseException)]
    refused = [r for r in got if isinstance(r, OpenAIError)]
    assert len(admitted) == 3 and len(refused) == 17  # 3 × 15 ≤ 50 < 4 × 15
    assert {r.code for r in refused} == {"token_limit_exceeded"} and "15 needed" in refused[0].message
    for reservation in admitted:
        assert reservation is not None
        await limiter.settle(reservation, 5)  # each used far less than it reserved
    assert await limiter.reserve(tenant, 30) is not None  # 15 used, 30 more fit under 50


async def test_a_budget_over_the_whole_limit_is_admitted_into_an_empty_window_and_an_overrun_is_charged():
    limiter = Limiter(METRICS, clock=Clock())
    tenant = Tenant(id="acme", tokens_per_minute=100)
    big = await limiter.reserve(tenant, 10_000)  # never fits as asked: capped at the limit
    assert big is not None and big.tokens == 100
    await limiter.settle(big, 300)  # used more than it could reserve: charged all of it
    refused = await _refusal(limiter.reserve(tenant, 1))
    assert int(refused.headers["retry-after"]) > 60  # 300 of 100 must decay out of the window first


async def test_a_request_refused_for_its_tokens_gives_back_its_request():
    """Admitted by its requests-per-minute limit, then refused by its token limit: it counts as no request."""
    limiter = Limiter(METRICS, clock=Clock())
    tenant = Tenant(id="acme", requests_per_minute=1, tokens_per_minute=10)
    await limiter.reserve(tenant, 10)
    slot = await limiter.admit(tenant)
    await _refusal(limiter.reserve(tenant, 5))
    await limiter.refund_request(slot)
    assert await limiter.admit(tenant)  # the one request a minute is still there


async def test_answers_and_refusals_say_where_the_limits_stand():
    limiter = Limiter(METRICS, clock=Clock())
    tenant = Tenant(id="acme", requests_per_minute=3, tokens_per_minute=100)
    slot = await limiter.admit(tenant)
    reservation = await limiter.reserve(tenant, 40)
    assert reservation is not None
    headers = rate_headers(slot.requests, reservation.window)
    assert {k: headers[k] for k in ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                                     "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens")} == {
        "x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "2",
        "x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "60"}
    assert headers["x-ratelimit-reset-tokens"] == "1m30s"  # 30 s into this minute, empty after the next
    refused = await _refusal(limiter.reserve(tenant, 70))
    assert refused.headers["x-ratelimit-remaining-tokens"] == "60"


async def test_concurrency_is_per_tenant_and_given_back():
    limiter = Limiter(METRICS, clock=Clock())
    tenant, other = Tenant(id="acme", max_concurrency=1), Tenant(id="other", max_concurrency=1)
    slot = await limiter.admit(tenant)
    refused = await _refusal(limiter.admit(tenant))
    assert refused.code == "concurrency_limit_exceeded"
    await limiter.admit(other)
    slot.release()
    slot.release()  # once
    await limiter.admit(tenant)


# ---- Redis failing ------------------------------------------------------------------------------------------------


class _BrokenRedis:
    """Every script call fails, as a Redis that is down does; counts how often it was asked."""

    def __init__(self) -> None:
        self.asked = 0

    def register_script(self, script: str):
        async def call(**_: object) -> list[int]:
            self.asked += 1
            raise ConnectionError("redis is down")

        return call


async def test_after_a_failure_checks_fail_open_without_asking_redis_for_a_while():
    redis = _BrokenRedis()
    now = [100.0]  # the limiter's pause clock, moved by the test
    limiter = Limiter(METRICS, redis, retry_after_s=0.2, monotonic=lambda: now[0])  # type: ignore[arg-type]
    tenant = Tenant(id="acme", requests_per_minute=1, tokens_per_minute=1)
    before = _fail_open()
    for _ in range(5):  # over its limits, but the counts cannot be read: served, counted as failing open
        await limiter.admit(tenant)
        assert await limiter.reserve(tenant, 10) is None
    assert redis.asked == 1 and _fail_open() == before + 10
    now[0] += 0.19
    await limiter.admit(tenant)
    assert redis.asked == 1  # still within the pause
    now[0] += 0.02
    await limiter.admit(tenant)
    assert redis.asked == 2  # asked again once the pause is over


class _SlowRedis:
    """A reachable but slow Redis: every check answers after a pause, admitted."""

    def register_script(self, script: str):
        async def call(**_: object) -> list[int]:
            await asyncio.sleep(0.05)
            return [1, 1, 0]

        return call


async def test_concurrency_limit_holds_while_the_rate_counters_are_read():
    limiter = Limiter(METRICS, _SlowRedis(), timeout_s=1.0)  # type: ignore[arg-type]
    tenant = Tenant(id="acme", max_concurrency=1, requests_per_minute=100)
    results = await asyncio.gather(limiter.admit(tenant), limiter.admit(tenant), return_exceptions=True)
    refused = [r for r in results if isinstance(r, OpenAIError)]
    assert len(refused) == 1 and refused[0].code == "concurrency_limit_exceeded"  # not both let in
    limiter.leave(tenant)
    await limiter.admit(tenant)  # the admitted one left: room again
