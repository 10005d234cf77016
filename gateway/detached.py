"""Requests the gateway makes on its own account, after or beside a client's: bounded, versioned, stopped.

Cache shadow checks (`gateway.shadow`), router explorations (`gateway.exploration`) and agreement verifications
(`gateway.agreement`) each send a request the client never waits for. They share the rules for doing so: none
starts while the gateway drains or when `limit` of its kind already run (they are samples: dropping one biases
nothing), each holds the routing version its request was decided under (`RoutingHold`; none when nothing holds it
any more), and shutdown cancels what still runs and waits for it. What each one asks and records is its own; the
work releases the hold it is given when it is done with it.

Tested in `tests/gateway/test_shadow.py`, `tests/gateway/test_exploration.py` and `tests/gateway/test_agreement.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from tiergate.gateway.context import RequestContext
from tiergate.gateway.tiers import Routing, RoutingHold

__all__ = ["DetachedRequests"]


class DetachedRequests:
    """One kind of detached request (`name`: the tasks' name prefix), started through `start` and ended by `stop`."""

    def __init__(self, name: str, *, draining: Callable[[], bool],
                 hold: Callable[[Routing], RoutingHold | None]) -> None:
        self._name = name
        self._draining = draining
        self._hold = hold
        self._running: set[asyncio.Task[None]] = set()

    @property
    def running(self) -> int:
        """Requests of this kind under way now."""
        return len(self._running)

    def start(self, ctx: RequestContext, limit: int,
              work: Callable[[RoutingHold], Coroutine[Any, Any, None]]) -> bool:
        """Run `work(hold)` detached for `ctx`, holding its routing version; False (nothing started) while the
        gateway drains, when `limit` already run, or when its version is no longer held."""
        if self._draining() or len(self._running) >= limit:
            return False
        held = self._hold(ctx.routing)
        if held is None:
            return False
        task = asyncio.get_running_loop().create_task(work(held), name=f"tiergate-{self._name}-{ctx.request_id}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return True

    async def wait(self) -> None:
        """Until none runs (what is started meanwhile included)."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)

    async def stop(self) -> None:
        """Cancel what still runs and wait for it (shutdown): an unfinished request is a sample not taken."""
        tasks = list(self._running)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
