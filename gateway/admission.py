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

from tiergate.core.types import Priority

__all__ = ["Admission"]


_RECHECK_S = 0.25  # how often a waiter looks whether the tier grew (a node joined, the policy raised a limit)


class Admission:
    def __init__(self, capacity: Callable[[], int], max_waiting: int = 256) -> None:
        self._capacity = capacity  # re-read on every admission: pools grow and shrink as nodes come and go
        self._max_waiting = max_waiting
        self._inflight = 0
        self._waiting = 0  # live waiters; the heap may also hold ones that gave up (`_dead` of them)
        self._dead = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return self._waiting

    def saturated(self) -> bool:
        return self._inflight >= self._capacity()

    async def acquire(self, priority: Priority, timeout_s: float) -> bool:
        """Take a slot, waiting at most `timeout_s`; False means shed (the caller answers 429/503 or overflows)."""
        self._wake()
        if self._inflight < self._capacity() and not self._waiting:
            self._inflight += 1
            return True
        if timeout_s <= 0 or self._waiting >= self._max_waiting:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._waiters, (-int(priority), next(self._seq), fut))
        self._waiting += 1
        deadline = loop.time() + timeout_s
        try:
            while not fut.done():
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait((fut,), timeout=min(left, _RECHECK_S))
                self._wake()  # capacity may have grown with nobody releasing a slot
        except asyncio.CancelledError:
            if fut.done():
                self.release()  # we were handed a slot but will not use it
            else:
                self._give_up(fut)
            raise
        if fut.done():
            return True  # the slot was handed over by _wake(); _inflight already counts it
        self._give_up(fut)
        return False

    def _give_up(self, fut: asyncio.Future[None]) -> None:
        """Leave the queue. The heap entry stays (a heap cannot drop one from its middle cheaply) and is skipped
        when it reaches the top; once such dead entries outnumber the live ones, the heap is rebuilt without them.

        Without the rebuild, a waiter that keeps the top (a long-waiting higher priority) lets the entries of
        every lower-priority waiter that times out behind it pile up for as long as the overload lasts.
        Rebuilding costs O(live) at most once per that many give-ups: O(1) amortised, and the heap never
        holds more than twice the live waiters (plus one).
        """
        fut.cancel()
        self._waiting -= 1
        self._dead += 1
        if self._dead > self._waiting:
            self._waiters = [w for w in self._waiters if not w[2].done()]
            heapq.heapify(self._waiters)
            self._dead = 0

    def _wake(self) -> None:
        """Hand free slots to the highest-priority waiters, as many as the (current) capacity allows."""
        waiters = self._waiters
        while waiters and (waiters[0][2].done() or self._inflight < self._capacity()):
            fut = heapq.heappop(waiters)[2]
            if fut.done():
                self._dead -= 1
                continue  # gave up (timed out or cancelled); already uncounted
            self._inflight += 1
            self._waiting -= 1
            fut.set_result(None)

    def release(self) -> None:
        """Free a slot; the highest-priority waiter, if any, takes it before any newcomer can."""
        self._inflight -= 1
        if self._waiters:
            self._wake()
