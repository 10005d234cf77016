"""`edge_node.engine.handoff`: batches pushed from another thread reach the loop, the last ones included; `Handoffs`
put them into their requests' queues."""

from __future__ import annotations

import asyncio
import os
import threading
from types import SimpleNamespace

from tiergate.edge_node.engine.handoff import Handoffs, LoopHandoff


def _write(fd: int, data: bytes, n: int) -> int:
    return os.write(fd, data[:n])


def test_batches_pushed_from_a_thread_are_delivered_in_order():
    async def main() -> list[int]:
        got: list[int] = []
        done = asyncio.Event()

        def deliver(batch: int) -> None:
            got.append(batch)
            if batch == 99:
                done.set()

        h = LoopHandoff(asyncio.get_running_loop(), _write, deliver)
        t = threading.Thread(target=lambda: [h.push(i) for i in range(100)])
        t.start()
        await asyncio.wait_for(done.wait(), 30)
        t.join()
        h.close()
        return got

    assert asyncio.run(main()) == list(range(100))


def test_close_delivers_what_is_queued_before_the_reader_runs():
    """The engine's stop pushes every request's error, then schedules `close` on the loop: `close` can run before
    the pipe's reader callback. Those errors must still be delivered, or the requests would wait forever."""

    async def main() -> tuple[list[str], bool]:
        got: list[str] = []
        h = LoopHandoff(asyncio.get_running_loop(), _write, got.append)
        h.push("error for request 1")
        h.push("error for request 2")
        h.close()  # in the same callback: the reader has had no chance to run
        return got, h.push("late")

    got, accepted_late = asyncio.run(main())
    assert got == ["error for request 1", "error for request 2"]
    assert accepted_late is False


def test_close_after_the_loop_closed_frees_the_pipe_without_delivering():
    got: list[str] = []
    loop = asyncio.new_event_loop()
    h = LoopHandoff(loop, _write, got.append)
    loop.close()
    assert h.push("x") is False
    h.close()
    assert got == []


def test_handoffs_put_each_loops_chunks_into_its_requests_queues_and_skip_cancelled_ones():
    """`Handoffs`: a step's chunks reach the queues of their requests in the loop that submitted them; a cancelled
    request gets nothing; a closed loop's hand-off is dropped, and everything is closed on `close_all`."""
    handoffs = Handoffs(_write)

    async def main() -> tuple[list[str], bool]:
        loop = asyncio.get_running_loop()
        handoffs.register(loop)
        live = SimpleNamespace(queue=asyncio.Queue(), cancelled=False)
        gone = SimpleNamespace(queue=asyncio.Queue(), cancelled=True)
        t = threading.Thread(target=handoffs.deliver, args=({loop: [(live, "a"), (gone, "x"), (live, "b")]},))
        t.start()
        got = [await asyncio.wait_for(live.queue.get(), 30) for _ in range(2)]
        t.join()
        return got, gone.queue.empty()

    assert asyncio.run(main()) == (["a", "b"], True)
    handoffs.close_all()  # that loop is closed now: closed at once
    handoffs.deliver({})
