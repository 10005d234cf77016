"""Per-endpoint circuit breaker: stop sending traffic to a server that keeps failing.

Closed: traffic flows; `threshold` consecutive failures open it. Open: no traffic for `open_s`.
Half-open: exactly one trial request is let through (its lease expires after `probe_ttl_s` in case
the caller never reports back, e.g. dispatch succeeded on an earlier candidate); its success closes
the breaker, its failure opens it again. The clock is injectable so tests need no sleeping.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


class CircuitBreaker:
    def __init__(
        self,
        threshold: int = 3,
        open_s: float = 10.0,
        probe_ttl_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        self.threshold = threshold
        self.open_s = open_s
        self.probe_ttl_s = open_s if probe_ttl_s is None else probe_ttl_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._probe_until: float | None = None
        self.opened_count = 0  # times it went from closed/half-open to open

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self.open_s:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def available(self) -> bool:
        """Could a request go there now? (Does not take the half-open trial slot.)"""
        state = self.state
        if state is BreakerState.CLOSED:
            return True
        if state is BreakerState.OPEN:
            return False
        return self._probe_until is None or self._clock() >= self._probe_until

    def acquire(self) -> bool:
        """Take permission for one request; in half-open this hands out the single trial."""
        if not self.available():
            return False
        if self.state is BreakerState.HALF_OPEN:
            self._probe_until = self._clock() + self.probe_ttl_s
        return True

    def record(self, ok: bool) -> BreakerState:
        """Feed one outcome; returns the new state."""
        if ok:
            self._failures = 0
            self._opened_at = None
            self._probe_until = None
            return BreakerState.CLOSED
        self._failures += 1
        was_closed = self._opened_at is None
        if self.state is BreakerState.HALF_OPEN or (was_closed and self._failures >= self.threshold):
            self._opened_at = self._clock()
            self._probe_until = None
            self.opened_count += 1
        return self.state
