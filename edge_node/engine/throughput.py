"""Tokens generated per second over a sliding window: what /metrics and the gateway's balancing read.

The decode thread adds each step's count; readers (scrapes, heartbeats) take the rate. Samples older than the
window are dropped on both sides, so memory stays bounded even if nobody ever reads the rate.
"""

from __future__ import annotations

import threading
import time
from collections import deque

__all__ = ["TokenRate"]


class TokenRate:
    """Thread-safe tokens-per-second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, tokens: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._samples.append((now, tokens))
            self._prune(now)

    def per_second(self) -> float:
        with self._lock:
            self._prune(time.monotonic())
            total = sum(n for _, n in self._samples)
        return total / self.window_s

    def __len__(self) -> int:
        return len(self._samples)

    def _prune(self, now: float) -> None:
        horizon = now - self.window_s
        while self._samples and self._samples[0][0] < horizon:
            self._samples.popleft()
