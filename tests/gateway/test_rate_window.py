"""`gateway.rate_window`: the sliding window's arithmetic, and that the wait a refusal reports is the wait that works."""

from __future__ import annotations

import asyncio
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from tiergate.gateway.rate_window import WINDOW_S, LocalCounters, reset_s, retry_after_s


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _fill(counters: LocalCounters, clock: _Clock, prev: int, cur: int, offset: float) -> None:
    """`prev` taken in the previous minute, `cur` in this one; then the clock `offset` s into this minute."""
    start = 60 * 100_000.0
    clock.now = start - WINDOW_S
    if prev:
        assert (await counters.take("k", 10**9, prev)).ok
    clock.now = start
    if cur:
        assert (await counters.take("k", 10**9, cur)).ok
    clock.now = start + offset


@settings(max_examples=300, deadline=None)
@given(prev=st.integers(0, 200), cur=st.integers(0, 200), offset=st.floats(0, 59.9),
       limit=st.integers(1, 300), amount=st.integers(1, 300))
def test_a_refusals_wait_is_enough_and_not_much_more(prev, cur, offset, limit, amount):
    async def run() -> None:
        clock = _Clock(0.0)
        counters = LocalCounters(clock)
        await _fill(counters, clock, prev, cur, offset)
        first = await counters.take("k", limit, amount)
        if first.ok:
            assert first.retry_after_s == 0 and first.remaining == max(0, math.floor(limit - first.used))
            return
        wait = first.retry_after_s
        if amount > limit:
            assert wait == math.inf
            return
        clock.now += wait + 1e-6
        assert (await counters.take("k", limit, amount)).ok, "admitted once the reported wait is over"

    asyncio.run(run())


@settings(max_examples=200, deadline=None)
@given(prev=st.integers(0, 200), cur=st.integers(0, 200), offset=st.floats(0, 59.9),
       limit=st.integers(1, 300), amount=st.integers(1, 300))
def test_a_refusal_a_second_before_the_reported_wait_is_still_a_refusal(prev, cur, offset, limit, amount):
    """The wait is not padded: a second earlier the amount does not fit yet."""
    async def run() -> None:
        clock = _Clock(0.0)
        counters = LocalCounters(clock)
        await _fill(counters, clock, prev, cur, offset)
        first = await counters.take("k", limit, amount)
        if first.ok or not math.isfinite(first.retry_after_s) or first.retry_after_s < 1:
            return
        clock.now += first.retry_after_s - 1
        assert not (await counters.take("k", limit, amount)).ok

    asyncio.run(run())


def test_the_reset_is_when_nothing_is_counted_any_more():
    assert reset_s(0, 0, 10) == 0
    assert reset_s(0, 5, 10) == 50  # the previous minute has decayed by the end of this one
    assert reset_s(5, 0, 10) == 110  # this minute counts until the end of the next
    assert retry_after_s(0, 0, 30, 10, 11) == math.inf
