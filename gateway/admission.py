"""Priority admission to a tier: a bounded number of requests in flight, the rest wait in priority order.

When a tier is saturated, a waiting request of higher priority is admitted before any of lower
priority; nobody waits longer than the policy's queue timeout, and the queue itself is bounded,
so overload turns into a fast, explicit 429/503 (or an overflow to another tier) rather than a hang.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

from policies.types import Priority

__all__ = ["Admission"]


class Admission:
    def __init__(self, capacity: Callable[[], int], max_waiting: int = 256) -> None:
        self._capacity = capacity  # re-read on every admission: pools grow and shrink as nodes come and go
        self._max_waiting = max_waiting
        self._inflight = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return sum(1 for _, _, f in self._waiters if not f.done())

    def saturated(self) -> bool:
        return self._inflight >= self._capacity()

    async def acquire(self, priority: Priority, timeout_s: float) -> bool:
        """Take a slot, waiting at most `timeout_s`; False means shed (the caller answers 429/503 or overflows)."""
        self._prune()
        if self._inflight < self._capacity() and not self._waiters:
            self._inflight += 1
            return True
        if timeout_s <= 0 or len(self._waiters) >= self._max_waiting:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (-int(priority), next(self._seq), fut))
        try:
            async with asyncio.timeout(timeout_s):
                await fut
            return True  # the slot was handed over by release(); _inflight already counts it
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # handed over just as the timer fired
            fut.cancel()
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # we were handed a slot but will not use it
            else:
                fut.cancel()
            raise

    def _prune(self) -> None:
        while self._waiters and self._waiters[0][2].done():
            heapq.heappop(self._waiters)

    def release(self) -> None:
        """Free a slot, handing it straight to the highest-priority waiter if there is one."""
        if self._inflight <= self._capacity():
            self._prune()
            if self._waiters:
                heapq.heappop(self._waiters)[2].set_result(None)  # the slot passes over: _inflight unchanged
                return
        self._inflight -= 1
