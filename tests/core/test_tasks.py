"""core/tasks: a stopped task has finished; its cancellation is not an error, a failure it ended with is."""

from __future__ import annotations

import asyncio

import pytest

from tiergate.core.tasks import cancel_and_wait

pytestmark = pytest.mark.anyio


async def test_the_task_has_finished_when_it_returns_and_its_cleanup_ran() -> None:
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def loop() -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # for ever, like a sweeper
        finally:
            await asyncio.sleep(0)  # a cleanup that itself awaits must still complete before the stop returns
            cleaned.set()

    task = asyncio.create_task(loop())
    await started.wait()
    await cancel_and_wait(task)
    assert task.done() and task.cancelled()
    assert cleaned.is_set()


async def test_no_task_is_nothing_to_stop() -> None:
    await cancel_and_wait(None)


async def test_a_task_that_had_failed_raises_its_error() -> None:
    async def broken() -> None:
        raise RuntimeError("the loop died")

    task = asyncio.create_task(broken())
    await asyncio.wait({task})
    with pytest.raises(RuntimeError, match="the loop died"):
        await cancel_and_wait(task)
