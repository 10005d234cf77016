import asyncio

import pytest

from tests.support.waiting import eventually
from tiergate.core.types import Priority
from tiergate.gateway.admission import Admission

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
    await eventually(lambda: adm.waiting == 1, "LOW queued")
    high = asyncio.create_task(wait("high", Priority.HIGH))
    await eventually(lambda: adm.waiting == 2, "HIGH queued behind it")
    adm.release()  # the slot passes to HIGH although LOW queued first
    await eventually(lambda: order != [], "a waiter admitted")
    assert order == ["high"] and adm.waiting == 1
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
    await eventually(lambda: adm.waiting == 1, "the first waiter queued")
    assert not await adm.acquire(Priority.CRITICAL, 5)  # queue full: refused at once
    adm.release()
    assert await waiter


async def test_cancelled_waiter_does_not_leak_a_slot():
    adm = Admission(lambda: 1)
    assert await adm.acquire(Priority.NORMAL, 0)
    waiter = asyncio.create_task(adm.acquire(Priority.NORMAL, 5))
    await eventually(lambda: adm.waiting == 1, "the waiter queued")
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    adm.release()
    assert adm.inflight == 0


async def test_waiters_are_admitted_when_the_tier_grows_without_any_release():
    size = [1]
    adm = Admission(lambda: size[0])
    assert await adm.acquire(Priority.NORMAL, 0)
    waiters = [asyncio.create_task(adm.acquire(Priority.NORMAL, 5)) for _ in range(2)]
    await eventually(lambda: adm.waiting == 2, "both waiters queued")
    size[0] = 3  # a node joined: two more slots, and the request holding the first one is still busy
    assert await asyncio.wait_for(asyncio.gather(*waiters), 2) == [True, True]
    assert adm.inflight == 3 and adm.waiting == 0


async def test_waiters_that_gave_up_do_not_count_against_the_queue_bound():
    adm = Admission(lambda: 1, max_waiting=2)
    assert await adm.acquire(Priority.NORMAL, 0)
    # Two waiters behind a higher-priority one time out; their heap entries stay until they reach the top.
    high = asyncio.create_task(adm.acquire(Priority.HIGH, 5))
    await eventually(lambda: adm.waiting == 1, "HIGH queued")
    assert not await adm.acquire(Priority.LOW, 0.05)
    assert adm.waiting == 1
    assert not await adm.acquire(Priority.LOW, 0.05)
    late = asyncio.create_task(adm.acquire(Priority.NORMAL, 5))
    await eventually(lambda: adm.waiting == 2, "high and late queued")  # the queue has room for exactly these two
    adm.release()
    assert await high
    adm.release()
    assert await late
    assert adm.inflight == 1 and adm.waiting == 0


async def test_the_heap_stays_bounded_under_a_long_overload():
    # One slot, held for the whole test; a HIGH waiter keeps the top of the heap all along, so nothing behind it
    # ever reaches the top; meanwhile thousands of LOW waiters queue and give up (cancelled or timed out).
    # Their heap entries must not pile up: the heap holds at most twice the live waiters, plus one.
    adm = Admission(lambda: 1, max_waiting=8)
    assert await adm.acquire(Priority.NORMAL, 0)
    high = asyncio.create_task(adm.acquire(Priority.HIGH, 60))
    await asyncio.sleep(0)
    largest = 0
    for _ in range(500):
        lows = [asyncio.create_task(adm.acquire(Priority.LOW, 60)) for _ in range(4)]
        await asyncio.sleep(0)
        assert adm.waiting == 5
        for t in lows:
            t.cancel()
        await asyncio.gather(*lows, return_exceptions=True)
        largest = max(largest, len(adm._waiters))
        assert len(adm._waiters) <= 2 * adm.waiting + 1
    for _ in range(20):
        assert not await adm.acquire(Priority.LOW, 0.001)  # gives up by timing out
        assert len(adm._waiters) <= 2 * adm.waiting + 1
    assert largest <= 11 and adm.waiting == 1
    adm.release()
    assert await high  # the waiter that held the top all along is still served, and first
    adm.release()
    assert adm.inflight == 0 and adm.waiting == 0
    assert await adm.acquire(Priority.LOW, 0)


# ---- tenants of one priority take turns ------------------------------------------------------------------------


async def _queue(adm: Admission, tenant: str, order: list[str], prio: Priority = Priority.NORMAL) -> bool:
    admitted = await adm.acquire(prio, 30, tenant)
    if admitted:
        order.append(tenant)
    return admitted


async def test_a_tenants_flood_does_not_make_another_tenant_wait_behind_all_of_it():
    """Sixty of one tenant's requests wait; another tenant's one request, queued after them, is admitted second,
    not sixty-first."""
    adm = Admission(lambda: 1)
    assert await adm.acquire(Priority.NORMAL, 0, "flood")
    order: list[str] = []
    floods = [asyncio.create_task(_queue(adm, "flood", order)) for _ in range(60)]
    await eventually(lambda: adm.waiting == 60, "the flood queued")
    peer = asyncio.create_task(_queue(adm, "peer", order))
    await eventually(lambda: adm.waiting == 61, "the peer queued behind it")
    for admitted in range(1, 4):
        adm.release()
        await eventually(lambda admitted=admitted: len(order) == admitted, "one more admitted")
    assert order == ["flood", "peer", "flood"]
    for _ in range(59):
        adm.release()
    await asyncio.gather(*floods, peer)
    assert len(order) == 61 and adm.waiting == 0


async def test_a_full_queue_is_one_tenants_alone_but_a_newcomer_pushes_out_the_biggest_holder():
    adm = Admission(lambda: 1, max_waiting=4)
    assert await adm.acquire(Priority.NORMAL, 0, "flood")
    order: list[str] = []
    floods = [asyncio.create_task(_queue(adm, "flood", order)) for _ in range(4)]
    await eventually(lambda: adm.waiting == 4, "the queue full of one tenant's requests")
    assert not await adm.acquire(Priority.NORMAL, 1, "flood")  # its own fifth: shed at once
    peer = asyncio.create_task(_queue(adm, "peer", order))
    await eventually(lambda: sum(t.done() for t in floods) == 1, "the flood's newest pushed out")
    assert [t.result() for t in floods if t.done()] == [False] and adm.waiting == 4
    for _ in range(5):
        adm.release()
        await asyncio.sleep(0)
    await asyncio.gather(*floods, peer)
    assert order[:2] == ["flood", "peer"] and order.count("flood") == 3


async def test_a_newcomer_never_pushes_out_a_higher_priority_waiter():
    adm = Admission(lambda: 1, max_waiting=2)
    assert await adm.acquire(Priority.NORMAL, 0, "a")
    order: list[str] = []
    highs = [asyncio.create_task(_queue(adm, "a", order, Priority.HIGH)) for _ in range(2)]
    await eventually(lambda: adm.waiting == 2, "two high-priority waiters")
    assert not await adm.acquire(Priority.LOW, 1, "b")
    assert adm.waiting == 2 and not any(t.done() for t in highs)
    for _ in range(3):
        adm.release()
        await asyncio.sleep(0)
    await asyncio.gather(*highs)
