"""The status page's charts over time and its spend table: read from the Prometheus counters this gateway holds.

Every `step_s` the counters the charts need are summed once (`sample`): requests by tier and by cache result,
spend and its all-cloud reference, the saving by source (`gateway.savings`), cascade decisions, and the quality
signals savings are never shown without: cascade escalations, shadow checks that found a cached answer wrong,
and clients' feedback on cached answers. The page gets the differences between consecutive samples, so each
point is what happened in its step, and a gateway restart (counters back at 0) shows as a gap, not a dip.

The registry is the one source: the page shows what Prometheus scrapes from this process, never a second count
that could disagree with it. Each pod shows its own; fleet-wide views are Grafana's (deploy/grafana).

Tested in `tests/gateway/test_history.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

__all__ = ["History"]

_HITS = frozenset({"hit-exact", "hit-semantic"})
_TOP_TENANTS = 50


@dataclass(slots=True)
class _Point:
    """Cumulative counter values at one moment (what `sample` read)."""

    t: float
    tiers: dict[str, float] = field(default_factory=dict)
    hits: float = 0.0
    lookups: float = 0.0
    spend: float = 0.0
    reference: float = 0.0
    saved: dict[str, float] = field(default_factory=dict)
    kept: float = 0.0
    escalated: float = 0.0
    shadow_wrong: float = 0.0
    shadow_checked: float = 0.0
    feedback_wrong: float = 0.0
    feedback_right: float = 0.0
    tenants: dict[str, list[float]] = field(default_factory=dict)  # tenant -> [spend, reference]
    currency: str = ""


def _money(value: float) -> float:
    """A difference of two running sums, without the float noise (1e-20) a step with no spend leaves: what
    `x-tiergate-cost` shows, 10 decimals."""
    return round(value, 10) + 0.0  # + 0.0: no -0.0


class History:
    """Samples of this gateway's counters, `points` of them `step_s` apart (an hour by default)."""

    def __init__(self, registry: CollectorRegistry, step_s: float = 5.0, points: int = 720,
                 clock: Callable[[], float] = time.time) -> None:
        self._registry = registry
        self.step_s = step_s
        self._clock = clock
        self._points: deque[_Point] = deque(maxlen=points + 1)  # one more: the base of the first difference
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.sample()
        self._task = asyncio.create_task(self._run(), name="status-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.step_s)
            self.sample()

    def sample(self) -> None:
        """Read the counters now (one pass over the registry)."""
        p = _Point(self._clock())
        saved_ref: dict[str, float] = {}
        saved_spend: dict[str, float] = {}
        for family in self._registry.collect():
            name = family.name
            for s in family.samples:
                if not s.name.endswith("_total"):
                    continue
                labels, v = s.labels, s.value
                if name == "tiergate_requests":
                    p.tiers[labels["tier"]] = p.tiers.get(labels["tier"], 0.0) + v
                    if labels["cache"] in _HITS:
                        p.hits += v
                        p.lookups += v
                    elif labels["cache"] == "miss":
                        p.lookups += v
                elif name == "tiergate_spend":
                    p.spend += v
                    p.currency = labels["currency"]
                    p.tenants.setdefault(labels["tenant"], [0.0, 0.0])[0] += v
                elif name == "tiergate_spend_reference":
                    p.reference += v
                    p.tenants.setdefault(labels["tenant"], [0.0, 0.0])[1] += v
                elif name == "tiergate_savings_reference":
                    saved_ref[labels["source"]] = saved_ref.get(labels["source"], 0.0) + v
                elif name == "tiergate_savings_spend":
                    saved_spend[labels["source"]] = saved_spend.get(labels["source"], 0.0) + v
                elif name == "tiergate_cascade":
                    if labels["outcome"] == "kept":
                        p.kept += v
                    else:
                        p.escalated += v
                elif name == "tiergate_cache_verifications":
                    wrong = labels["result"] == "wrong"
                    if labels["source"] == "verify":
                        p.shadow_checked += v
                        p.shadow_wrong += v if wrong else 0.0
                    elif labels["source"] == "feedback":
                        if wrong:
                            p.feedback_wrong += v
                        else:
                            p.feedback_right += v
        p.saved = {k: saved_ref.get(k, 0.0) - saved_spend.get(k, 0.0) for k in saved_ref.keys() | saved_spend.keys()}
        self._points.append(p)

    def snapshot(self) -> dict[str, Any]:
        """The charts' series (one value per step; None where there is nothing to divide) and the totals since
        start: spend, savings by source beside the quality signals, and the spend per tenant. A look more than a
        step after the last sample samples first, so the totals are never a step behind."""
        if not self._points or self._clock() - self._points[-1].t >= self.step_s:
            self.sample()
        points = list(self._points)
        series: dict[str, Any] = {"t": [], "requests": {}, "spend": [], "saved": [], "saved_by": {},
                                  "hit_rate": [], "cascade_kept_rate": []}
        tiers = sorted({t for p in points for t in p.tiers})
        sources = sorted({s for p in points for s in p.saved})
        series["requests"] = {t: [] for t in tiers}
        series["saved_by"] = {s: [] for s in sources}
        for a, b in zip(points, points[1:], strict=False):
            if b.spend < a.spend or sum(b.tiers.values()) < sum(a.tiers.values()):
                continue  # counters went back (a registry swapped in tests): no honest difference
            series["t"].append(round(b.t, 3))
            for t in tiers:
                series["requests"][t].append(b.tiers.get(t, 0.0) - a.tiers.get(t, 0.0))
            series["spend"].append(_money(b.spend - a.spend))
            series["saved"].append(_money((b.reference - b.spend) - (a.reference - a.spend)))
            for s in sources:
                series["saved_by"][s].append(_money(b.saved.get(s, 0.0) - a.saved.get(s, 0.0)))
            lookups, judged = b.lookups - a.lookups, (b.kept + b.escalated) - (a.kept + a.escalated)
            series["hit_rate"].append((b.hits - a.hits) / lookups if lookups else None)
            series["cascade_kept_rate"].append((b.kept - a.kept) / judged if judged else None)
        last = points[-1] if points else _Point(self._clock())
        judged = last.kept + last.escalated
        feedback = last.feedback_wrong + last.feedback_right
        tenants = sorted(last.tenants.items(), key=lambda kv: -kv[1][0])[:_TOP_TENANTS]
        return {
            "step_s": self.step_s,
            "series": series,
            "costs": {
                "currency": last.currency,
                "spend": last.spend, "reference": last.reference, "saved": last.reference - last.spend,
                "saved_by": dict(sorted(last.saved.items())),
                "quality": {
                    "cascade": {"kept": last.kept, "escalated": last.escalated,
                                "escalated_share": last.escalated / judged if judged else None},
                    "shadow_checks": {"checked": last.shadow_checked, "wrong": last.shadow_wrong,
                                      "wrong_share": last.shadow_wrong / last.shadow_checked
                                      if last.shadow_checked else None},
                    "cache_feedback": {"right": last.feedback_right, "wrong": last.feedback_wrong,
                                       "wrong_share": last.feedback_wrong / feedback if feedback else None},
                },
            },
            "tenants": [{"tenant": t, "spend": s, "reference": r, "saved": r - s} for t, (s, r) in tenants],
            "tenants_total": len(last.tenants),
        }
