"""`edge_node.engine.handoff.LoopHandoff`: batches pushed from another thread reach the loop, the last ones included."""

from __future__ import annotations

import asyncio
import os
import threading

from tiergate.edge_node.engine.handoff import LoopHandoff


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
