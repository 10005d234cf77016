import asyncio

import pytest

from gateway.admission import Admission
from policies.types import Priority

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_admits_up_to_capacity_then_sheds_without_wait():
    adm = Admission(lambda: 2)
    assert await adm.acquire(Priority.NORMAL, 0)
    assert await adm.acquire(Priority.NORMAL, 0)
    assert not await adm.acquire(Priority.CRITICAL, 0)  # no waiting allowed: shed at once
    assert adm.inflight == 2


async def test_higher_priority_waiter_goes_first():
    adm = Admission(lambda: 1)
    assert await adm.acquire(Priority.NORMAL, 1)
    order: list[str] = []

    async def wait(name: str, prio: Priority) -> None:
        assert await adm.acquire(prio, 5)
        order.append(name)

    low = asyncio.create_task(wait("low", Priority.LOW))
    await asyncio.sleep(0.01)
    high = asyncio.create_task(wait("high", Priority.HIGH))
    await asyncio.sleep(0.01)
    assert adm.waiting == 2
    adm.release()  # the slot passes to HIGH although LOW queued first
    await asyncio.sleep(0.01)
    assert order == ["high"]
    adm.release()
    await asyncio.gather(low, high)
    assert order == ["high", "low"]
    adm.release()
    assert adm.inflight == 0


async def test_waiter_times_out_and_leaves_no_trace():
    adm = Admission(lambda: 1)
    assert await adm.acquire(Priority.NORMAL, 0)
    assert not await adm.acquire(Priority.HIGH, 0.05)
    assert adm.waiting == 0
    adm.release()
    assert adm.inflight == 0
    assert await adm.acquire(Priority.LOW, 0)


async def test_bounded_queue_sheds_excess_waiters():
    adm = Admission(lambda: 1, max_waiting=1)
    assert await adm.acquire(Priority.NORMAL, 0)
    waiter = asyncio.create_task(adm.acquire(Priority.NORMAL, 5))
    await asyncio.sleep(0.01)
    assert not await adm.acquire(Priority.CRITICAL, 5)  # queue full: refused at once
    adm.release()
    assert await waiter


async def test_cancelled_waiter_does_not_leak_a_slot():
    adm = Admission(lambda: 1)
    assert await adm.acquire(Priority.NORMAL, 0)
    waiter = asyncio.create_task(adm.acquire(Priority.NORMAL, 5))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    adm.release()
    assert adm.inflight == 0
