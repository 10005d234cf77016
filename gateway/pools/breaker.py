"""Per-endpoint circuit breaker: stop sending traffic to a server that keeps failing. The one breaker of the
project: the cloud pool (`gateway.pools.cloud`) and the edge pool (`gateway.pools.edge`) both use it.

Closed: traffic flows; `threshold` consecutive failures open it. Open: no traffic for the open period.
Half-open: `acquire()` lets exactly one trial request through (its lease expires after `probe_ttl_s` in case
the caller never reports back, e.g. dispatch succeeded on an earlier candidate); its success closes
the breaker, its failure opens it again. A pool that asks only `available()` lets all traffic through once the
open period is over (the edge pool's cool-down). The open period is `open_s`, times `backoff` for each
consecutive failure past the threshold, at most `max_open_s`; with `late_failures_reopen` a failure while open
(a request already in flight when it opened) starts a new, longer period instead of being ignored.
With `min_sources`, the consecutive failures that open it must come from that many sources (the tenants whose
requests failed): one tenant's requests that break a backend cannot take it away from everyone else. A failure
with no source (a health probe, an operator's check) is evidence of its own.
The clock is injectable so tests need no sleeping.
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
        *,
        backoff: float = 1.0,
        max_open_s: float | None = None,
        late_failures_reopen: bool = False,
        min_sources: int = 1,
    ) -> None:
        if threshold < 1:
            raise ValueError("threshold must be >= 1")
        if backoff < 1.0:
            raise ValueError("backoff must be >= 1")
        self.threshold = threshold
        self.open_s = open_s
        self.probe_ttl_s = open_s if probe_ttl_s is None else probe_ttl_s
        self.backoff = backoff
        self.max_open_s = max_open_s
        self.late_failures_reopen = late_failures_reopen
        self.min_sources = min_sources
        self._clock = clock
        self._failures = 0
        self._sources: set[str] = set()  # whose consecutive failures these are
        self._unsourced = False  # one of them came with no source
        self._opened_at: float | None = None
        self._open_for = open_s  # the current (or last) open period
        self._probe_until: float | None = None
        self.opened_count = 0  # times it went from closed/half-open to open

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self._open_for:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    @property
    def open_for_s(self) -> float:
        """The length of the current open period (of the last one, when closed)."""
        return self._open_for

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

    def record(self, ok: bool, source: str | None = None) -> BreakerState:
        """Feed one outcome (`source`: whose request it was); returns the new state."""
        if ok:
            self._failures = 0
            self._sources.clear()
            self._unsourced = False
            self._opened_at = None
            self._probe_until = None
            return BreakerState.CLOSED
        self._failures += 1
        if source is None:
            self._unsourced = True
        elif len(self._sources) < self.min_sources:
            self._sources.add(source)
        state = self.state
        evidence = self._unsourced or len(self._sources) >= self.min_sources
        if (state is BreakerState.HALF_OPEN
                or (state is BreakerState.CLOSED and self._failures >= self.threshold and evidence)
                or (state is BreakerState.OPEN and self.late_failures_reopen)):
            period = self.open_s * self.backoff ** max(0, self._failures - self.threshold)
            self._open_for = period if self.max_open_s is None else min(self.max_open_s, period)
            self._opened_at = self._clock()
            self._probe_until = None
            self.opened_count += 1
        return self.state
