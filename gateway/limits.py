"""Per-tenant limits: requests and tokens per minute, and concurrent requests.

Counters use a sliding window over two fixed one-minute buckets (the previous bucket weighted by how much
of it still overlaps the window), which is what most API gateways do: O(1) memory per tenant and accurate
to a few percent. With Redis (one server or a Cluster) the buckets are shared by every gateway replica
(INCRBY + EXPIRE, pipelined); if Redis does not answer in time the check fails open — a cache-and-limits
outage must not become an outage of the API — and a metric counts it. After a failure the checks skip Redis
for `retry_after_s` (failing open at once), so an outage does not add the timeout to every request.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core.errors import OpenAIError, rate_limited
from tiergate.gateway.auth import Tenant
from tiergate.gateway.metrics import GatewayMetrics

__all__ = ["Limiter", "TenantSlot"]

_WINDOW = 60.0


class _RedisSkipped(Exception):
    """Redis failed moments ago: this check fails open without waiting for it again."""


class TenantSlot:
    """One of a tenant's concurrent requests; whoever ends the answer gives it back, once."""

    __slots__ = ("_limiter", "tenant")

    def __init__(self, limiter: Limiter, tenant: Tenant) -> None:
        self._limiter: Limiter | None = limiter
        self.tenant = tenant

    def release(self) -> None:
        if self._limiter is not None:
            self._limiter.leave(self.tenant)
            self._limiter = None


class Limiter:
    def __init__(self, metrics: GatewayMetrics, redis: AnyRedis | None = None, timeout_s: float = 0.05, prefix: str = "tg:rl",
                 retry_after_s: float = 1.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._metrics = metrics
        self._monotonic = monotonic  # the pause after a Redis failure runs on it (tests pass their own clock)
        self._redis = redis
        self._timeout = timeout_s
        self._retry_after = retry_after_s
        self._skip_redis_until = 0.0  # monotonic; set by a failure
        self._prefix = prefix
        self._local: dict[str, int] = defaultdict(int)  # "tenant:kind:bucket" → count, when there is no Redis
        self._concurrent: dict[str, int] = defaultdict(int)

    @staticmethod
    def _buckets(now: float) -> tuple[int, int, float]:
        cur = int(now // _WINDOW)
        weight_prev = 1.0 - (now % _WINDOW) / _WINDOW
        return cur, cur - 1, weight_prev

    async def _counts(self, tenant: str, kind: str, add: int) -> tuple[float, float]:
        """Add `add` to the current bucket; return (estimated count in the window, seconds until it frees up)."""
        now = time.time()
        cur, prev, w = self._buckets(now)
        k_cur, k_prev = f"{tenant}:{kind}:{cur}", f"{tenant}:{kind}:{prev}"
        if self._redis is None:
            self._local[k_cur] += add
            c, p = self._local[k_cur], self._local.get(k_prev, 0)
            if len(self._local) > 10_000:
                self._prune(prev)
        else:
            # The hash tag keeps a tenant's buckets in one slot on a Redis Cluster (one node per pipeline).
            key_cur = f"{self._prefix}:{{{tenant}}}:{kind}:{cur}"
            key_prev = f"{self._prefix}:{{{tenant}}}:{kind}:{prev}"
            if self._monotonic() < self._skip_redis_until:
                raise _RedisSkipped
            try:
                async with asyncio.timeout(self._timeout):
                    pipe = self._redis.pipeline(transaction=False)
                    pipe.incrby(key_cur, add)
                    pipe.expire(key_cur, int(2 * _WINDOW) + 1)
                    pipe.get(key_prev)
                    c, _, p = await pipe.execute()
            except Exception:
                self._skip_redis_until = self._monotonic() + self._retry_after
                raise
            c, p = int(c), int(p or 0)
        return c + p * w, _WINDOW - (now % _WINDOW)

    def _prune(self, keep_from: int) -> None:
        for k in [k for k in self._local if int(k.rsplit(":", 1)[1]) < keep_from]:
            del self._local[k]

    async def admit(self, tenant: Tenant) -> TenantSlot:
        """Count one request against the tenant's limits, or raise a 429 with Retry-After.

        An admitted request holds one of the tenant's concurrent slots until the slot is released. The slot is taken
        before the rate counters are read (which may wait on Redis), so that concurrent requests cannot all
        pass the concurrency check while each waits on Redis; a refusal gives it back.
        """
        if tenant.max_concurrency is not None and self._concurrent[tenant.id] >= tenant.max_concurrency:
            self._metrics.rate_limited.labels(tenant.id, "concurrency").inc()
            raise rate_limited(f"Tenant `{tenant.id}` already has {tenant.max_concurrency} requests in flight.", 1,
                               code="concurrency_limit_exceeded")
        self.enter(tenant)
        try:
            await self._check_rates(tenant)
        except BaseException:
            self.leave(tenant)
            raise
        return TenantSlot(self, tenant)

    async def _check_rates(self, tenant: Tenant) -> None:
        try:
            if tenant.requests_per_minute is not None:
                used, reset = await self._counts(tenant.id, "req", 1)
                if used > tenant.requests_per_minute:
                    self._metrics.rate_limited.labels(tenant.id, "requests").inc()
                    raise rate_limited(f"Tenant `{tenant.id}` is over its limit of {tenant.requests_per_minute} "
                                       "requests per minute.", reset)
            if tenant.tokens_per_minute is not None:
                used, reset = await self._counts(tenant.id, "tok", 0)
                if used >= tenant.tokens_per_minute:
                    self._metrics.rate_limited.labels(tenant.id, "tokens").inc()
                    raise rate_limited(f"Tenant `{tenant.id}` is over its limit of {tenant.tokens_per_minute} "
                                       "tokens per minute.", reset, code="token_limit_exceeded")
        except OpenAIError:
            raise
        except Exception:  # Redis slow or down: fail open, counted
            self._metrics.fail_open.inc()

    async def charge_tokens(self, tenant: Tenant, tokens: int) -> None:
        """Record the tokens an answer used (prompt + completion) once it is known."""
        if tenant.tokens_per_minute is None or tokens <= 0:
            return
        try:
            await self._counts(tenant.id, "tok", tokens)
        except Exception:
            self._metrics.fail_open.inc()

    def enter(self, tenant: Tenant) -> None:
        self._concurrent[tenant.id] += 1

    def leave(self, tenant: Tenant) -> None:
        self._concurrent[tenant.id] -= 1
