"""A rolling window of this gateway process's recent requests, for the status page.

The gateway feeds it once per finished request (`gateway.accounting.Accounting.record`): exact percentiles of
this process's recent requests, not bucket interpolations, and no coupling to the Prometheus registry.
Fleet-wide views belong to Prometheus and Grafana (deploy/grafana).

Tested in `tests/gateway/test_status.py`.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Stats"]

_HITS = ("hit-exact", "hit-semantic")

@dataclass(frozen=True, slots=True)
class _Sample:
    t: float
    tier: str
    cache: str
    status: int
    seconds: float


def _percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (a value that really occurred), None when there is nothing to rank."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


class Stats:
    """A rolling window of recent requests plus totals since start; `record` is O(1) on the request path.

    The window is bounded both in time (`window_s`) and in size (`max_samples`), so a traffic spike costs
    a fixed amount of memory; under more than max_samples/window_s requests per second the percentiles
    describe the most recent max_samples requests.
    """

    def __init__(self, window_s: int = 60, rate_window_s: int = 10, max_samples: int = 20_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        self._clock = clock
        self._samples: deque[_Sample] = deque(maxlen=max_samples)
        self.started = clock()
        self.total = 0
        self.total_by_tier: Counter[str] = Counter()
        self.total_by_cache: Counter[str] = Counter()
        self.total_errors = 0

    def record(self, tier: str, cache: str, status: int, seconds: float) -> None:
        """One answered (or refused with 5xx/429) request: which tier answered, the cache result, how long."""
        self._samples.append(_Sample(self._clock(), tier, cache, status, seconds))
        self.total += 1
        self.total_by_tier[tier] += 1
        self.total_by_cache[cache] += 1
        if status >= 500 or status == 429:
            self.total_errors += 1

    def snapshot(self) -> dict[str, Any]:
        """What the page shows: the last `window_s` seconds per tier and per cache result, a per-second
        series for the chart, and the totals since start."""
        now = self._clock()
        horizon = now - self.window_s
        while self._samples and self._samples[0].t < horizon:
            self._samples.popleft()
        recent = list(self._samples)
        uptime = max(now - self.started, 1e-9)

        per_tier: dict[str, list[_Sample]] = {}
        for s in recent:
            per_tier.setdefault(s.tier, []).append(s)
        tiers = {}
        for tier, samples in per_tier.items():
            secs = sorted(s.seconds for s in samples)
            tiers[tier] = {
                "requests": len(samples),
                "share": len(samples) / len(recent),
                "errors": sum(1 for s in samples if s.status >= 500 or s.status == 429),
                "p50_ms": _ms(_percentile(secs, 0.50)),
                "p95_ms": _ms(_percentile(secs, 0.95)),
                "max_ms": _ms(secs[-1]),
            }

        cache = Counter(s.cache for s in recent)
        hits = sum(cache[k] for k in _HITS)
        lookups = hits + cache["miss"]
        rate_span = min(self.rate_window_s, uptime)
        in_rate = sum(1 for s in recent if s.t >= now - self.rate_window_s)

        series: dict[str, list[int]] = {t: [0] * self.window_s for t in per_tier}
        for s in recent:
            age = int(now - s.t)
            if 0 <= age < self.window_s:
                series[s.tier][self.window_s - 1 - age] += 1  # oldest first, the current second last

        all_secs = sorted(s.seconds for s in recent)
        return {
            "window_s": self.window_s,
            "rate_window_s": self.rate_window_s,
            "uptime_s": round(uptime, 3),
            "requests": len(recent),
            "rps": in_rate / rate_span,
            "errors": sum(1 for s in recent if s.status >= 500 or s.status == 429),
            "p50_ms": _ms(_percentile(all_secs, 0.50)),
            "p95_ms": _ms(_percentile(all_secs, 0.95)),
            "tiers": tiers,
            "cache": {"hit-exact": cache["hit-exact"], "hit-semantic": cache["hit-semantic"],
                      "miss": cache["miss"], "bypass": cache["bypass"], "lookups": lookups,
                      "hit_rate": hits / lookups if lookups else None},
            "series": series,
            "totals": {"requests": self.total, "errors": self.total_errors, "by_tier": dict(self.total_by_tier),
                       "by_cache": dict(self.total_by_cache)},
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
