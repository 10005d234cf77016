"""CircuitBreaker: opens after N consecutive failures, lets one trial through when half-open; the only breaker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tiergate.gateway.pools.breaker import BreakerState, CircuitBreaker


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


def test_one_tenants_failures_alone_never_open_a_breaker_that_wants_two() -> None:
    b = CircuitBreaker(threshold=3, open_s=10, clock=Clock(), min_sources=2)
    for _ in range(10):  # a tenant whose requests break the backend, over and over
        assert b.record(False, "mallory") is BreakerState.CLOSED
    assert b.record(False, "alice") is BreakerState.OPEN  # a second tenant's failure: real evidence
    b.record(True)
    for _ in range(2):
        b.record(False, "mallory")
    assert b.record(False) is BreakerState.OPEN  # a failure with no tenant (a probe) is evidence of its own


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
    with pytest.raises(ValueError):
        CircuitBreaker(backoff=0.5)


def test_cool_down_grows_with_each_failure_up_to_the_cap_and_late_failures_reopen() -> None:
    """The edge pool's settings: open 5 s, doubled per further failure, at most 60 s; every failure past the
    threshold (in flight when it opened, or after the cool-down) starts a new period; only asked, no trial."""
    clock = Clock()
    b = CircuitBreaker(2, 5.0, clock=clock, backoff=2.0, max_open_s=60.0, late_failures_reopen=True)
    b.record(False)
    assert b.available()
    b.record(False)
    assert not b.available() and b.open_for_s == 5.0
    clock.t += 1
    b.record(False)  # while open: a new period, twice as long, from now
    assert b.open_for_s == 10.0 and b.opened_count == 2
    clock.t += 9.9
    assert not b.available()
    clock.t += 0.1
    assert b.available() and b.available(), "asking takes no trial: all traffic flows again"
    for _ in range(5):
        b.record(False)
    assert b.open_for_s == 60.0
    assert b.record(True) is BreakerState.CLOSED and b.available()


ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("core", "complexity", "policies", "cache", "edge_node", "cloud_pool", "gateway")


def breaker_classes(root: Path) -> list[str]:
    """Classes named *Breaker in product code, as path:name."""
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and node.name.endswith("Breaker"):
                    found.append(f"{path.relative_to(root)}:{node.name}")
    return found


def test_there_is_one_circuit_breaker_in_product_code(tmp_path: Path) -> None:
    """Both pools use gateway/pools/breaker.py; a second breaker class anywhere is found (the check can fail)."""
    assert breaker_classes(ROOT) == ["gateway/pools/breaker.py:CircuitBreaker"]
    (tmp_path / "gateway").mkdir()
    (tmp_path / "edge_node").mkdir()
    (tmp_path / "gateway" / "breaker.py").write_text("class CircuitBreaker:\n    pass\n")
    (tmp_path / "edge_node" / "pool.py").write_text("class Thing:\n    class CoolDownBreaker:\n        pass\n")
    assert breaker_classes(tmp_path) == ["edge_node/pool.py:CoolDownBreaker", "gateway/breaker.py:CircuitBreaker"]
