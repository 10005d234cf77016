"""Priority admission to a tier: a bounded number of requests in flight, the rest wait in priority order, and
tenants of one priority take turns.

When a tier is saturated, a waiting request of higher priority is admitted before any of lower priority; nobody
waits longer than the policy's queue timeout, and the queue itself is bounded, so overload turns into a fast,
explicit 429/503 (or an overflow to another tier) rather than a hang.

Within a priority, waiters are served in start-time fair order (each tenant's next waiter is tagged one turn after
its previous one, never before the turn being served): a tenant that queued sixty requests does not make another
tenant's one request wait behind all of them. A full queue is still all one tenant's to use, but a newcomer from
a tenant with fewer waiters pushes out the newest waiter of the tenant with the most (of no higher priority than
the newcomer's): a flood cannot fill the queue and lock the other tenants out.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from tiergate.core.types import Priority

__all__ = ["Admission"]


_RECHECK_S = 0.25  # how often a waiter looks whether the tier grew (a node joined, the policy raised a limit)


@dataclass(slots=True, eq=False)
class _Waiter:
    priority: int
    tag: float  # its tenant's turn: the fair order within a priority
    seq: int
    tenant: str
    fut: asyncio.Future[bool]  # True: admitted (it holds a slot); False: pushed out of a full queue


class Admission:
    def __init__(self, capacity: Callable[[], int], max_waiting: int = 256) -> None:
        self._capacity = capacity  # re-read on every admission: pools grow and shrink as nodes come and go
        self._max_waiting = max_waiting
        self._inflight = 0
        self._waiting = 0  # live waiters; the heap may also hold ones that left (`_dead` of them)
        self._dead = 0
        self._waiters: list[tuple[int, float, int, _Waiter]] = []
        self._seq = itertools.count()
        self._turn = 0.0  # the tag being served: a newcomer's tag starts from here
        self._tags: dict[str, float] = {}  # tenant -> the tag of its latest waiter
        self._queued: dict[str, list[_Waiter]] = {}  # tenant -> its live waiters

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def waiting(self) -> int:
        return self._waiting

    def saturated(self) -> bool:
        return self._inflight >= self._capacity()

    async def acquire(self, priority: Priority, timeout_s: float, tenant: str = "") -> bool:
        """Take a slot, waiting at most `timeout_s`; False means shed (the caller answers 429/503 or overflows)."""
        self._wake()
        if self._inflight < self._capacity() and not self._waiting:
            self._inflight += 1
            return True
        if timeout_s <= 0 or self._waiting >= self._max_waiting and not self._push_out(tenant, int(priority)):
            return False
        loop = asyncio.get_running_loop()
        tag = max(self._turn, self._tags.get(tenant, 0.0)) + 1.0
        self._tags[tenant] = tag
        w = _Waiter(int(priority), tag, next(self._seq), tenant, loop.create_future())
        heapq.heappush(self._waiters, (-w.priority, w.tag, w.seq, w))
        self._queued.setdefault(tenant, []).append(w)
        self._waiting += 1
        deadline = loop.time() + timeout_s
        fut = w.fut
        try:
            while not fut.done():
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait((fut,), timeout=min(left, _RECHECK_S))
                self._wake()  # capacity may have grown with nobody releasing a slot
        except asyncio.CancelledError:
            if not fut.done():
                self._give_up(w)
            elif fut.result():
                self.release()  # we were handed a slot but will not use it
            raise
        if fut.done():
            return fut.result()  # admitted by _wake() (_inflight counts it), or pushed out (uncounted)
        self._give_up(w)
        return False

    def _leave(self, w: _Waiter) -> None:
        """`w` no longer waits (admitted, pushed out or gone): its tenant's list forgets it."""
        mine = self._queued.get(w.tenant)
        if mine is not None:
            mine.remove(w)
            if not mine:
                del self._queued[w.tenant]
        self._waiting -= 1
        if not self._waiting:  # nobody waits: the turns start over, and no tenant is remembered
            self._tags.clear()
            self._turn = 0.0

    def _push_out(self, tenant: str, priority: int) -> bool:
        """The queue is full: make room for `tenant` by shedding the newest waiter of the tenant with the most
        waiters, when that is another tenant with at least two more than `tenant` has, and the waiter's priority
        is not above `priority`. Returns whether room was made."""
        mine = len(self._queued.get(tenant, ()))
        hog = max(self._queued.values(), key=len, default=[])
        if len(hog) < mine + 2 or hog[0].tenant == tenant:
            return False
        victim = max((w for w in hog if w.priority <= priority), key=lambda w: (-w.priority, w.seq), default=None)
        if victim is None:
            return False
        self._leave(victim)
        self._dead += 1  # its heap entry stays until it reaches the top
        victim.fut.set_result(False)
        return True

    def _give_up(self, w: _Waiter) -> None:
        """Leave the queue. The heap entry stays (a heap cannot drop one from its middle cheaply) and is skipped
        when it reaches the top; once such dead entries outnumber the live ones, the heap is rebuilt without them.

        Without the rebuild, a waiter that keeps the top (a long-waiting higher priority) lets the entries of
        every lower-priority waiter that times out behind it pile up for as long as the overload lasts.
        Rebuilding costs O(live) at most once per that many give-ups: O(1) amortised, and the heap never
        holds more than twice the live waiters (plus one).
        """
        w.fut.cancel()
        self._leave(w)
        self._dead += 1
        if self._dead > self._waiting:
            self._waiters = [e for e in self._waiters if not e[3].fut.done()]
            heapq.heapify(self._waiters)
            self._dead = 0

    def _wake(self) -> None:
        """Hand free slots to the first waiters in order, as many as the (current) capacity allows."""
        waiters = self._waiters
        while waiters and (waiters[0][3].fut.done() or self._inflight < self._capacity()):
            w = heapq.heappop(waiters)[3]
            if w.fut.done():
                self._dead -= 1
                continue  # gave up or pushed out; already uncounted
            self._inflight += 1
            self._turn = max(self._turn, w.tag)
            self._leave(w)
            w.fut.set_result(True)

    def release(self) -> None:
        """Free a slot; the first waiter, if any, takes it before any newcomer can."""
        self._inflight -= 1
        if self._waiters:
            self._wake()
