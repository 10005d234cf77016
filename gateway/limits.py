"""Per-tenant limits: concurrent requests, requests per minute and tokens per minute.

A request is admitted (`admit`: a concurrent slot, then one request of the window) before its body is classified;
once the policy has decided, it reserves its token budget (`reserve`: the prompt plus the most the backend may
generate), so that concurrent requests cannot all pass a limit that only some of them fit. Its settlement then
corrects the reservation to what was really used (`settle`). Refusals count nothing, and say when a retry would be
admitted (Retry-After, from the same window the check reads) and where the limits stand (`x-ratelimit-*`, as
OpenAI sends them).

The windows live in Redis when configured, shared by every replica (`gateway.rate_window`). If Redis does not answer
in time the check fails open (a cache-and-limits outage must not become an outage of the API), counted in a metric;
after a failure the checks skip Redis for `retry_after_s`, so that an outage does not add the timeout to every
request.

Tested in `tests/gateway/test_limits.py`, `tests/gateway/test_app_limits.py` and, against real Redis,
`tests/integration/test_limits_redis.py`.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core.errors import OpenAIError, rate_limited
from tiergate.gateway.auth import Tenant
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.rate_window import Counters, LocalCounters, RedisCounters, Take

__all__ = ["Limiter", "Reservation", "TenantSlot", "rate_headers"]


class _RedisSkipped(Exception):
    """Redis failed moments ago: this check fails open without waiting for it again."""


class TenantSlot:
    """One of a tenant's concurrent requests; whoever ends the answer gives it back, once. `requests` is the
    requests-per-minute window as this request's admission left it (None: no such limit, or Redis unreadable)."""

    __slots__ = ("_limiter", "requests", "tenant")

    def __init__(self, limiter: Limiter, tenant: Tenant, requests: Take | None = None) -> None:
        self._limiter: Limiter | None = limiter
        self.tenant = tenant
        self.requests = requests

    def release(self) -> None:
        if self._limiter is not None:
            self._limiter.leave(self.tenant)
            self._limiter = None


@dataclass(slots=True)
class Reservation:
    """Tokens a request took from its tenant's window at admission; its settlement corrects them to what it used."""

    tenant: Tenant
    tokens: int
    window: Take


class Limiter:
    def __init__(self, metrics: GatewayMetrics, redis: AnyRedis | None = None, timeout_s: float = 0.05,
                 prefix: str = "tg:rl", retry_after_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic,
                 clock: Callable[[], float] = time.time) -> None:
        self._metrics = metrics
        self._monotonic = monotonic  # the pause after a Redis failure runs on it (tests pass their own clock)
        self._counters: Counters = RedisCounters(redis, clock) if redis is not None else LocalCounters(clock)
        self._shared = redis is not None
        self._timeout = timeout_s
        self._retry_after = retry_after_s
        self._skip_redis_until = 0.0  # monotonic; set by a failure
        self._prefix = prefix
        self._concurrent: dict[str, int] = defaultdict(int)

    def _key(self, tenant: Tenant, kind: str) -> str:
        # The hash tag keeps a tenant's buckets in one slot on a Redis Cluster (one script, one node).
        return f"{self._prefix}:{{{tenant.id}}}:{kind}"

    async def _take(self, tenant: Tenant, kind: str, limit: int, amount: int) -> Take | None:
        """Take `amount` from the window; None when Redis cannot be read (fail open, counted)."""
        if not self._shared:
            return await self._counters.take(self._key(tenant, kind), limit, amount)
        if self._monotonic() < self._skip_redis_until:
            self._metrics.fail_open.inc()
            return None
        try:
            async with asyncio.timeout(self._timeout):
                return await self._counters.take(self._key(tenant, kind), limit, amount)
        except Exception:
            self._skip_redis_until = self._monotonic() + self._retry_after
            self._metrics.fail_open.inc()
            return None

    async def admit(self, tenant: Tenant) -> TenantSlot:
        """One of the tenant's concurrent slots and one request of its window, or a 429 that counts nothing.

        The slot is taken before the window is read (which may wait on Redis), so that concurrent requests cannot
        all pass the concurrency check while each waits on Redis; a refusal gives it back.
        """
        if tenant.max_concurrency is not None and self._concurrent[tenant.id] >= tenant.max_concurrency:
            self._metrics.rate_limited.labels(tenant.id, "concurrency").inc()
            raise rate_limited(f"Tenant `{tenant.id}` already has {tenant.max_concurrency} requests in flight.", 1,
                               code="concurrency_limit_exceeded")
        self.enter(tenant)
        try:
            window = None
            if tenant.requests_per_minute is not None:
                window = await self._take(tenant, "req", tenant.requests_per_minute, 1)
                if window is not None and not window.ok:
                    self._metrics.rate_limited.labels(tenant.id, "requests").inc()
                    raise _refused(f"Tenant `{tenant.id}` is over its limit of {tenant.requests_per_minute} "
                                   "requests per minute.", window, "requests", "rate_limit_exceeded")
        except BaseException:
            self.leave(tenant)
            raise
        return TenantSlot(self, tenant, window)

    async def reserve(self, tenant: Tenant, tokens: int) -> Reservation | None:
        """Take `tokens` (the prompt plus the most the answer may use) from the tenant's window, or raise a 429.

        A budget larger than the whole limit is capped at it: such a request is admitted into an empty window
        (and settled to what it really used) rather than never. None: no token limit, or Redis unreadable.
        """
        limit = tenant.tokens_per_minute
        if limit is None:
            return None
        tokens = max(1, min(tokens, limit))
        window = await self._take(tenant, "tok", limit, tokens)
        if window is None:
            return None
        if not window.ok:
            self._metrics.rate_limited.labels(tenant.id, "tokens").inc()
            raise _refused(f"Tenant `{tenant.id}` is over its limit of {limit} tokens per minute "
                           f"({tokens} needed for this request).", window, "tokens", "token_limit_exceeded")
        return Reservation(tenant, tokens, window)

    async def refund_request(self, slot: TenantSlot) -> None:
        """Take back the request `slot`'s admission counted: it was refused after all (its token budget)."""
        if slot.requests is None:
            return
        try:
            async with asyncio.timeout(self._timeout):
                await self._counters.adjust(self._key(slot.tenant, "req"), slot.requests.bucket, -1)
        except Exception:
            self._metrics.fail_open.inc()

    async def settle(self, reservation: Reservation, used: int) -> None:
        """Correct a reservation to the tokens the request really used (more or fewer)."""
        delta = used - reservation.tokens
        if delta == 0:
            return
        try:
            async with asyncio.timeout(self._timeout):
                await self._counters.adjust(self._key(reservation.tenant, "tok"), reservation.window.bucket, delta)
        except Exception:
            self._metrics.fail_open.inc()

    async def tokens_used(self, tenant: Tenant) -> float | None:
        """What the tenant's token window counts now, reservations included (None: no limit, or unreadable)."""
        if tenant.tokens_per_minute is None:
            return None
        window = await self._take(tenant, "tok", tenant.tokens_per_minute, 0)
        return None if window is None else window.used

    def enter(self, tenant: Tenant) -> None:
        self._concurrent[tenant.id] += 1

    def leave(self, tenant: Tenant) -> None:
        self._concurrent[tenant.id] -= 1
        if self._concurrent[tenant.id] <= 0:
            del self._concurrent[tenant.id]


def _refused(message: str, window: Take, kind: str, code: str) -> OpenAIError:
    error = rate_limited(message, window.retry_after_s if math.isfinite(window.retry_after_s) else 60.0, code=code)
    error.headers.update(_headers(window, kind))
    return error


def rate_headers(requests: Take | None, tokens: Take | None) -> dict[str, str]:
    """`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` for the windows a request was admitted under."""
    out: dict[str, str] = {}
    if requests is not None:
        out |= _headers(requests, "requests")
    if tokens is not None:
        out |= _headers(tokens, "tokens")
    return out


def _headers(window: Take, kind: str) -> dict[str, str]:
    return {f"x-ratelimit-limit-{kind}": str(window.limit), f"x-ratelimit-remaining-{kind}": str(window.remaining),
            f"x-ratelimit-reset-{kind}": _duration(window.reset_s)}


def _duration(seconds: float) -> str:
    """OpenAI's way of writing a reset time: `1m30s`, `12s`, `250ms`."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
