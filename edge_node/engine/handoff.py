"""Hand results from the engine thread to an asyncio loop without giving up the GIL.

`loop.call_soon_threadsafe` wakes the loop with a socket `send`, which releases the GIL; the woken
loop thread takes it, and the engine thread then waits to get it back before it can even start the
next `llama_decode`. Here the engine appends to a deque and wakes the loop through a pipe written with
a GIL-holding libc `write` (see `edge_node.engine.gilcalls`): the loop thread wakes, waits for the GIL, and
gets it as soon as the engine enters `llama_decode` — so delivery overlaps decoding instead of
delaying it. One pending byte is enough to wake the loop, so at most one write per wake-up.

`Handoffs` keeps one `LoopHandoff` per event loop that submits requests, and puts each step's chunks into the
queues of their requests in the loop that waits on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tiergate.edge_node.engine.request import ActiveRequest, Chunk

__all__ = ["Handoffs", "LoopHandoff"]


class LoopHandoff:
    """A wake-up pipe plus a queue of batches for one event loop. Create it in that loop's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop, write: Callable[[int, bytes, int], int],
                 deliver: Callable[[Any], None]) -> None:
        self.loop = loop
        self._write = write
        self._deliver = deliver
        self._items: deque[Any] = deque()
        self._signaled = False
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._closed = False
        loop.add_reader(self._r, self._drain)

    def push(self, batch: Any) -> bool:
        """Engine thread: queue a batch and wake the loop. False when the loop is gone."""
        if self._closed or self.loop.is_closed():
            return False
        self._items.append(batch)
        if not self._signaled:
            self._signaled = True
            self._write(self._w, b"\0", 1)  # a full pipe (EAGAIN) still means a wake-up is pending
        return True

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.read(self._r, 4096)
        self._signaled = False  # before draining: a batch pushed from now on writes a new byte
        while self._items:
            self._deliver(self._items.popleft())

    def close(self) -> None:
        """Loop thread (or after the loop closed): deliver what is still queued, stop watching the pipe, free it.

        The engine's last batches (the errors that end every request on a stop) can be queued with their wake-up
        byte unread when `close` runs: the loop may run a `call_soon_threadsafe(close)` before the pipe's reader
        callback. Delivering them here keeps every request's end, whichever runs first.
        """
        if self._closed:
            return
        self._closed = True
        if not self.loop.is_closed():
            while self._items:
                self._deliver(self._items.popleft())
            with contextlib.suppress(RuntimeError, ValueError):
                self.loop.remove_reader(self._r)
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)


class Handoffs:
    """The engine's hand-off to asyncio: one `LoopHandoff` for each event loop that submits requests."""

    def __init__(self, write: Callable[[int, bytes, int], int]) -> None:
        self._write = write
        self._by_loop: dict[asyncio.AbstractEventLoop, LoopHandoff] = {}

    def register(self, loop: asyncio.AbstractEventLoop) -> None:
        """In `loop`'s thread, before it submits: make its hand-off (and free those of loops closed since)."""
        if loop not in self._by_loop:
            for old in [lp for lp in self._by_loop if lp.is_closed()]:
                self._by_loop.pop(old).close()
            self._by_loop[loop] = LoopHandoff(loop, self._write, _put_all)

    def deliver(self, out: dict[asyncio.AbstractEventLoop, list[tuple[ActiveRequest, Chunk]]]) -> None:
        """Engine thread: each loop's chunks to that loop, one wake-up each."""
        for loop, items in out.items():
            h = self._by_loop.get(loop)
            if h is not None and not h.push(items):  # loop closed: nobody is listening any more
                self._by_loop.pop(loop, None)
                h.close()

    def close_all(self) -> None:
        """The engine stopped: close every hand-off in its loop's thread (at once if the loop is gone)."""
        for loop, h in list(self._by_loop.items()):
            self._by_loop.pop(loop, None)
            if loop.is_closed():
                h.close()
            else:
                try:
                    loop.call_soon_threadsafe(h.close)
                except RuntimeError:
                    h.close()


def _put_all(items: list[tuple[ActiveRequest, Chunk]]) -> None:
    for req, chunk in items:
        if not req.cancelled:
            req.queue.put_nowait(chunk)
