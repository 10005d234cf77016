"""Requests that break backends, refused for a while on every replica.

A request that two backends broke on (the connection dropped or garbage came back before the answer began, or the
node stopped answering its health checks while it waited) is taken for a poison: a request that kills or wedges
whatever serves it. Its fingerprint (`context.UpstreamBody.fingerprint`: a hash of its canonical body) is refused
for `ttl_s`, whoever sends it. One break is not evidence (an OOM, an operator's kill): dispatch then tries the
request on one other backend (`gateway.dispatch`).

The fingerprints live in Redis (a sorted set scored by expiry), shared by every replica, and in each replica's
memory, refreshed every `refresh_s`: the check each request makes is a set lookup, not a round trip. The replica
that quarantines a fingerprint refuses it at once; the others within `refresh_s`. Without Redis, each replica holds
its own.

Tested in `tests/gateway/test_quarantine.py` and `tests/gateway/test_app_poison.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from tiergate.cache.redis.conn import AnyRedis
from tiergate.core.errors import OpenAIError
from tiergate.core.tasks import cancel_and_wait

__all__ = ["Quarantine", "quarantined"]

log = structlog.get_logger("tiergate.gateway")
_KEY = "tg:quarantine"


def quarantined(ttl_s: float) -> OpenAIError:
    """The answer to a request whose fingerprint is quarantined: not retryable, and it says why."""
    return OpenAIError(400, f"This request broke two backends before its answer began; identical requests are "
                            f"refused for {round(ttl_s / 60) or 1} minutes. Change the request (its sampling "
                            f"parameters, structured-output schema or prompt) if it was not meant to.",
                       code="request_quarantined")


class Quarantine:
    def __init__(self, redis: AnyRedis | None = None, *, ttl_s: float = 600.0, refresh_s: float = 2.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._redis = redis
        self.ttl_s = ttl_s
        self._refresh_s = refresh_s
        self._clock = clock
        self._held: dict[str, float] = {}  # fingerprint -> expiry (wall clock)
        self._task: asyncio.Task[None] | None = None

    def active(self) -> bool:
        """Whether anything is quarantined (the request path computes no fingerprint otherwise)."""
        return bool(self._held)

    def holds(self, fingerprint: str) -> bool:
        expiry = self._held.get(fingerprint)
        if expiry is None:
            return False
        if expiry <= self._clock():
            del self._held[fingerprint]
            return False
        return True

    async def add(self, fingerprint: str) -> None:
        """Quarantine `fingerprint` here at once, and for every replica (best effort: Redis may be down)."""
        expiry = self._clock() + self.ttl_s
        self._held[fingerprint] = expiry
        log.warning("request_quarantined", fingerprint=fingerprint, seconds=self.ttl_s)
        if self._redis is None:
            return
        try:
            async with asyncio.timeout(1.0):
                await self._redis.zadd(_KEY, {fingerprint: expiry})
        except Exception as exc:  # this replica still refuses it
            log.warning("quarantine_not_shared", error=str(exc))

    async def refresh(self) -> None:
        """Read every replica's quarantined fingerprints (and drop the expired ones from Redis)."""
        if self._redis is None:
            return
        now = self._clock()
        async with asyncio.timeout(1.0):
            await self._redis.zremrangebyscore(_KEY, "-inf", now)
            rows = await self._redis.zrangebyscore(_KEY, now, "+inf", withscores=True)
        held: dict[str, float] = {}
        for row in rows:  # (member, score) pairs
            member, score = row[0], row[1]
            held[member.decode() if isinstance(member, bytes) else str(member)] = float(score)
        for fingerprint, expiry in self._held.items():  # added here, maybe not shared (Redis was down)
            if expiry > now:
                held.setdefault(fingerprint, expiry)
        self._held = held

    async def start(self) -> None:
        if self._redis is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-quarantine")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # Redis down: keep what is known, try again
                log.debug("quarantine_refresh_failed", error=str(exc))
            await asyncio.sleep(self._refresh_s)
