"""CircuitBreaker: opens after N consecutive failures, lets one trial through when half-open."""

from __future__ import annotations

import pytest

from tiergate.cloud_pool.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_threshold_consecutive_failures_only() -> None:
    b = CircuitBreaker(threshold=3, open_s=10, clock=Clock())
    b.record(False)
    b.record(False)
    b.record(True)  # a success resets the count
    b.record(False)
    b.record(False)
    assert b.state is BreakerState.CLOSED and b.available()
    assert b.record(False) is BreakerState.OPEN
    assert not b.available() and not b.acquire()
    assert b.opened_count == 1


def test_half_open_admits_exactly_one_trial_then_closes_on_success() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=1, open_s=10, probe_ttl_s=5, clock=clock)
    b.record(False)
    clock.t += 10
    assert b.state is BreakerState.HALF_OPEN
    assert b.acquire()
    assert not b.acquire(), "a second request must wait for the trial's outcome"
    assert b.record(True) is BreakerState.CLOSED
    assert b.acquire() and b.acquire()


def test_failed_trial_reopens_for_a_full_period() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=2, open_s=10, clock=clock)
    b.record(False)
    b.record(False)
    clock.t += 10
    assert b.acquire()
    assert b.record(False) is BreakerState.OPEN
    clock.t += 9.9
    assert b.state is BreakerState.OPEN
    clock.t += 0.1
    assert b.state is BreakerState.HALF_OPEN
    assert b.opened_count == 2


def test_unreported_trial_expires_so_the_breaker_cannot_stick() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=1, open_s=10, probe_ttl_s=3, clock=clock)
    b.record(False)
    clock.t += 10
    assert b.acquire()
    clock.t += 2.9
    assert not b.available()
    clock.t += 0.1
    assert b.acquire()


def test_late_failures_while_open_do_not_extend_or_recount() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=1, open_s=10, clock=clock)
    b.record(False)
    clock.t += 5
    b.record(False)  # a request that was already in flight when it opened
    clock.t += 5
    assert b.state is BreakerState.HALF_OPEN
    assert b.opened_count == 1


def test_threshold_must_be_positive() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(threshold=0)
