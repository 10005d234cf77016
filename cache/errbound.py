"""Semantic hits under a stated false-hit rate: the decision after the guards, and what it learns from.

An operator sets `CacheRule.max_false_hit_rate` (δ, e.g. 0.05) on a policy rule. For such a rule a semantic
candidate that passed the guards is not served because its cosine reaches a fixed threshold, but because
the evidence says that serving everything at that cosine keeps the share of wrong hits under δ:

- Every candidate's cosine falls into a cell (0.005 wide, from 0.80). Per tenant, each cell counts the
  lookups that landed there (T), and how many of them were labelled (L) and found wrong (E).
- Labels come from three places, none of which costs the client an answer:
  * verification: a sampled share (`CacheRule.verify_rate`) of would-be hits is sent to the tier instead,
    and the tier's answer is compared with the cached one (`cache.judge`);
  * judged misses: a candidate just below the cutoff (within `CacheSettings.judge_band`) is a miss anyway,
    so the tier's answer is compared with the candidate's as well;
  * explicit feedback (`POST /v1/cache/feedback`): the served answer was wrong.
- The cutoff for δ is the lowest cell edge whose one-sided 95 % upper confidence bound on the false-hit rate
  of "serve everything at or above it" is at most δ (stratified over the cells: each cell's error rate
  `(E + ½) / (L + 1)` weighted by its traffic T, its variance growing with the traffic it was not labelled
  on), among edges with at least 30/δ lookups above them. Without that much evidence there is no cutoff,
  and no semantic hit is served for the rule (exact hits are): the conservative start.
- Per entry, the threshold only ever rises: an entry found wrong for a request at cosine s (verified,
  judged or reported) is served afterwards only to requests closer than s. That threshold is kept by entry
  id (it outlives an invalidation: the same question stored again keeps it) for `entry_memory_s`.

The counts live in Redis (`tiergate:cache:eb:...`, any Redis version) and are shared by every gateway: each
adds what it saw every `errbound_sync_s` and reads everyone's totals back, so evidence found by one gateway
moves the cutoff of all. Without Redis they live in the process.

This is a statistical bound recomputed as evidence arrives, not a guarantee per request; it holds as well as
the judge's verdicts are right, and reacts only as fast as labels accumulate (docs/cache.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import structlog

from cache.metrics import CacheMetrics
from cache.settings import CacheSettings

if TYPE_CHECKING:
    from cache.shared import SharedState

__all__ = ["EDGES", "ErrorBound", "Verdict", "certified_cutoff", "estimate"]

log = structlog.get_logger("tiergate.cache.errbound")

EDGES = np.round(np.arange(0.80, 1.0, 0.005), 4)  # cell lower edges, ascending: the possible cutoffs
FLOOR = float(EDGES[0])  # candidates below this are neither counted nor served
_Z95 = 1.6448536269514722  # one-sided 95 %
_T, _L, _E = 0, 1, 2
Action = Literal["hit", "verify", "judge", "miss"]


def cell(sim: float) -> int:
    """The cell of a cosine: 0 below FLOOR, k for [EDGES[k-1], EDGES[k])."""
    return int(np.searchsorted(EDGES, sim, side="right"))


def certified_cutoff(counts: np.ndarray, delta: float) -> float:
    """The lowest edge whose 95 % upper bound on the false-hit rate above it is at most `delta`; inf if none.

    `counts`: (3, cells) T, L, E."""
    T, L, E = counts[_T].astype(float), counts[_L].astype(float), counts[_E].astype(float)
    p = (E + 0.5) / (L + 1.0)
    tail_t = np.cumsum(T[::-1])[::-1]
    tail_tp = np.cumsum((T * p)[::-1])[::-1]
    tail_var = np.cumsum((T * T * p * (1 - p) / (L + 1.0))[::-1])[::-1]
    n_min = 30.0 / delta
    best = math.inf
    for k in range(len(EDGES), 0, -1):  # cutoff EDGES[k-1]: cells k.. are served
        if tail_t[k] < n_min:
            continue
        ucb = (tail_tp[k] + _Z95 * math.sqrt(tail_var[k])) / tail_t[k]
        if ucb <= delta:
            best = float(EDGES[k - 1])
    return best


def estimate(counts: np.ndarray, cutoff: float) -> tuple[float, float]:
    """(point estimate, 95 % upper bound) of the false-hit rate of serving every candidate at or above `cutoff`."""
    if not math.isfinite(cutoff):
        return math.nan, math.nan
    k = cell(cutoff)
    T, L, E = (counts[i, k:].astype(float) for i in (_T, _L, _E))
    n = T.sum()
    if n <= 0:
        return math.nan, math.nan
    p = (E + 0.5) / (L + 1.0)
    point = float((T * p).sum() / n)
    return point, float(point + _Z95 * math.sqrt((T * T * p * (1 - p) / (L + 1.0)).sum()) / n)


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action  # hit: serve it; verify: ask the tier, then compare; judge: a miss, compare; miss: nothing
    cutoff: float  # the tenant's certified cutoff for this δ (inf: none yet)
    threshold: float  # what this candidate had to reach: max(cutoff, the entry's own threshold)


class ErrorBound:
    """The per-tenant cells, shared through `SharedState`, and the decisions made from them."""

    def __init__(self, shared: SharedState, settings: CacheSettings, metrics: CacheMetrics,
                 rng: random.Random | None = None) -> None:
        self.shared = shared
        self.settings = settings
        self.metrics = metrics
        self._rng = rng or random.Random()
        self._totals: dict[str, np.ndarray] = {}  # everyone's counts, as last read from the shared state
        self._local: dict[str, np.ndarray] = {}  # this process's counts not yet added to the shared state
        self._cutoffs: dict[tuple[str, float], float] = {}
        self._bounds: dict[str, set[float]] = {}  # the δs asked for per tenant (for the gauges)
        self._fresh: dict[str, int] = {}  # lookups counted per tenant since its cutoffs were last computed
        self._known: set[str] = set()  # tenants whose shared counts this process has read
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-cache-errbound")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2.0):
                await self.sync()  # hand over what this process learnt

    # -- decisions ---------------------------------------------------------------------------------------
    async def ensure(self, tenant: str) -> None:
        """Read a tenant's shared counts the first time this process decides for it (then every sync), so a
        gateway that just started uses the evidence the others gathered from its first request."""
        if tenant in self._known:
            return
        got = await self.shared.counts([tenant])
        self._known.add(tenant)
        if tenant in got:
            self._totals[tenant] = got[tenant]
            self._changed(tenant)

    def cutoff(self, tenant: str, delta: float) -> float:
        key = (tenant, delta)
        c = self._cutoffs.get(key)
        if c is None:
            c = self._cutoffs[key] = certified_cutoff(self.counts(tenant), delta)
            self._bounds.setdefault(tenant, set()).add(delta)
        return c

    def counts(self, tenant: str) -> np.ndarray:
        """Everyone's counts as last read, plus this process's since."""
        total = self._totals.get(tenant)
        local = self._local.get(tenant)
        if total is None:
            return local.copy() if local is not None else np.zeros((3, len(EDGES) + 1), np.int64)
        return total + local if local is not None else total.copy()

    def decide(self, tenant: str, sim: float, delta: float, verify_rate: float,
               entry_threshold: float | None = None) -> Verdict:
        """What to do with the best candidate that passed the guards (at cosine `sim`); counts the lookup."""
        if sim < FLOOR:
            return Verdict("miss", math.inf, math.inf)
        self._add(tenant, _T, sim)
        c = self.cutoff(tenant, delta)
        threshold = max(c, entry_threshold or 0.0)
        if sim >= threshold:
            action: Action = "verify" if self._rng.random() < verify_rate else "hit"
        elif sim >= min(c, 1.0) - self.settings.judge_band:
            action = "judge"
        else:
            action = "miss"
        if math.isfinite(threshold):
            self.metrics.semantic_threshold.observe(threshold)
        return Verdict(action, c, threshold)

    def record(self, tenant: str, sim: float, wrong: bool, source: str) -> None:
        """A label for a candidate at cosine `sim`: its answer was right or wrong for the request."""
        self.metrics.verifications.labels(tenant, source, "wrong" if wrong else "right").inc()
        if sim < FLOOR:
            return
        self._add(tenant, _L, sim)
        if wrong:
            self._add(tenant, _E, sim)

    def seed(self, tenant: str, sims: np.ndarray, wrong: np.ndarray) -> None:
        """Labelled lookups known before any traffic (a calibration set): counted and labelled at once."""
        sims = np.asarray(sims, float)
        wrong = np.asarray(wrong, bool)
        keep = sims >= FLOOR
        cells = np.searchsorted(EDGES, sims[keep], side="right")
        local = self._local_for(tenant)
        local[_T] += np.bincount(cells, minlength=local.shape[1])
        local[_L] += np.bincount(cells, minlength=local.shape[1])
        local[_E] += np.bincount(cells[wrong[keep]], minlength=local.shape[1])
        self._changed(tenant)

    def _local_for(self, tenant: str) -> np.ndarray:
        local = self._local.get(tenant)
        if local is None:
            local = self._local[tenant] = np.zeros((3, len(EDGES) + 1), np.int64)
        return local

    def _add(self, tenant: str, row: int, sim: float) -> None:
        self._local_for(tenant)[row, cell(sim)] += 1
        if row != _T:
            self._changed(tenant)
        else:  # traffic alone moves the cutoff slowly: recomputed every 50 lookups (and at every sync)
            n = self._fresh[tenant] = self._fresh.get(tenant, 0) + 1
            if n >= 50:
                self._changed(tenant)

    def _changed(self, tenant: str) -> None:
        self._fresh[tenant] = 0
        for key in [k for k in self._cutoffs if k[0] == tenant]:
            del self._cutoffs[key]

    # -- sharing -----------------------------------------------------------------------------------------
    async def sync(self) -> None:
        """Add this process's counts to the shared ones and read everyone's back."""
        pushing = {t: c for t, c in self._local.items() if c.any()}
        if pushing:
            await self.shared.add_counts({t: c.copy() for t, c in pushing.items()})
            for t, c in pushing.items():  # what arrived meanwhile stays local for the next round
                self._local[t] = self._local[t] - c
        tenants = set(self._totals) | set(self._local) | set(self._bounds)
        if not tenants:
            return
        totals = await self.shared.counts(sorted(tenants))
        for t in tenants:
            new = totals.get(t)
            if new is None:
                continue
            self._known.add(t)
            old = self._totals.get(t)
            if old is None or not np.array_equal(old, new):
                self._totals[t] = new
                self._changed(t)
        self._gauges()

    def _gauges(self) -> None:
        for tenant, deltas in self._bounds.items():
            counts = self.counts(tenant)
            for delta in deltas:
                c = self.cutoff(tenant, delta)
                point, upper = estimate(counts, c)
                label = f"{delta:g}"
                self.metrics.cutoff.labels(tenant, label).set(c if math.isfinite(c) else math.inf)
                self.metrics.false_hit_rate.labels(tenant, label, "point").set(point)
                self.metrics.false_hit_rate.labels(tenant, label, "upper95").set(upper)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.errbound_sync_s)
            started = time.perf_counter()
            try:
                await self.sync()
            except Exception as exc:  # the shared state is down: keep counting locally, try again later
                self.metrics.errors.labels("errbound_sync").inc()
                log.debug("cache_errbound_sync_failed", error=repr(exc),
                          seconds=round(time.perf_counter() - started, 3))
