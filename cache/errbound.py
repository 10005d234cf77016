"""Semantic hits under a stated false-hit rate: the decision after the guards, and what it learns from.

An operator sets `CacheRule.max_false_hit_rate` (δ, e.g. 0.05) on a policy rule. For such a rule a semantic
candidate that passed the guards is not served because its cosine reaches a fixed threshold, but because
the evidence says that serving everything at that cosine keeps the share of wrong hits under δ:

- Every candidate falls into a cell: its cosine (0.005 wide, from 0.80) in one of five regions of word
  overlap (the Jaccard share of content words the two questions have in common, `cache.guards.overlap`:
  below 0.2, 0.34, 0.5, 0.7, and above). Per tenant, each cell counts the lookups that landed there (T), and
  how many of them were labelled (L) and found wrong (E). Regions exist because one cosine means different
  things: at 0.95, a pair that shares few content words is a wrong hit far more often than one that shares
  most of them (docs/benchmarks.md: on the labelled pairs, at bounds of 15 % and 20 %, the regions' cutoffs
  serve more right hits than any single cosine threshold, the best one chosen in hindsight included).
- Labels come from three places, none of which costs the client an answer:
  * verification: a sampled share (`CacheRule.verify_rate`) of would-be hits is sent to the tier instead,
    and the tier's answer is compared with the cached one (`cache.judge`);
  * judged misses: a candidate just below the cutoff (within `CacheSettings.judge_band`) is a miss anyway,
    so the tier's answer is compared with the candidate's as well;
  * explicit feedback (`POST /v1/cache/feedback`): the served answer was wrong.
- The cutoffs for δ, one per region: cells are ranked by their error rate `(E + ½) / (L + 1)`, made
  non-increasing in cosine within each region (pooled with their neighbours where it is not), and the served
  cells are the longest prefix of that ranking whose one-sided 95 % upper confidence bound on the false-hit
  rate is at most δ (stratified over the served cells: each cell's rate weighted by its traffic T, its
  variance growing with the traffic it was not labelled on), with at least 30/δ lookups in them. Within a
  region that is every cell from some cosine up: the region's cutoff. Without that much evidence there is
  no cutoff, and no semantic hit is served for the rule (exact hits are): the conservative start. With one
  region this is the lowest cosine whose tail holds the bound.
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

from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.settings import CacheSettings
from tiergate.core.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tiergate.cache.shared import SharedState

__all__ = ["EDGES", "OVERLAP_EDGES", "REGION_LABELS", "ErrorBound", "BoundDecision", "certified_cutoffs", "estimate",
           "new_counts", "region"]

log = structlog.get_logger("tiergate.cache.errbound")

EDGES = np.round(np.arange(0.80, 1.0, 0.005), 4)  # cell lower edges, ascending: the possible cutoffs
FLOOR = float(EDGES[0])  # candidates below this are neither counted nor served
OVERLAP_EDGES = np.array([0.2, 0.34, 0.5, 0.7])  # region lower edges of word overlap (region 0: below 0.2)
REGIONS = len(OVERLAP_EDGES) + 1
CELLS = len(EDGES) + 1
REGION_LABELS = [f"{x:g}" for x in (0.0, *OVERLAP_EDGES.tolist())]  # a region by its lower edge (gauges, CLI)
_Z95 = 1.6448536269514722  # one-sided 95 %
_T, _L, _E = 0, 1, 2
Action = Literal["hit", "verify", "judge", "miss"]


def cell(sim: float) -> int:
    """The cell of a cosine: 0 below FLOOR, k for [EDGES[k-1], EDGES[k])."""
    return int(np.searchsorted(EDGES, sim, side="right"))


def region(overlap: float) -> int:
    """The region of a word overlap in [0, 1]: 0 below 0.2 ... 4 from 0.7."""
    return int(np.searchsorted(OVERLAP_EDGES, overlap, side="right"))


def new_counts() -> np.ndarray:
    """Empty counts: (3: T, L, E; regions; cells)."""
    return np.zeros((3, REGIONS, CELLS), np.int64)


def _non_increasing(p: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`p` pooled (weighted by `w`, labels + 1) wherever it rises with the index: the error rate may only fall
    as cosine rises (pool adjacent violators). A cell whose pool holds no label at all is inf: nothing is
    known about it, and serving it would cost the bound nothing on paper and an unknown rate in practice."""
    values: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for v, x in zip(p[::-1].tolist(), w[::-1].tolist(), strict=True):  # from the top cell down: non-decreasing
        values.append(v)
        weights.append(x)
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            v2, w2, n2 = values.pop(), weights.pop(), sizes.pop()
            total = weights[-1] + w2
            values[-1] = (values[-1] * weights[-1] + v2 * w2) / total
            weights[-1] = total
            sizes[-1] += n2
    known = [v if x > n else math.inf for v, x, n in zip(values, weights, sizes, strict=True)]  # w > 1: labelled
    return np.repeat(known, sizes)[::-1]


def _ranked(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every servable cell (region, cell >= 1): (pooled rate, the one cells are ranked by; traffic; stratified
    T·p; variance)."""
    T, L, E = (counts[i, :, 1:].astype(float) for i in (_T, _L, _E))  # cell 0 (below FLOOR) is never served
    p = (E + 0.5) / (L + 1.0)
    pooled = np.vstack([_non_increasing(p[g], L[g] + 1.0) for g in range(counts.shape[1])])
    return pooled, T, T * p, T * T * p * (1 - p) / (L + 1.0)


def certified_cutoffs(counts: np.ndarray, delta: float) -> np.ndarray:
    """Per region, the lowest cosine edge served under `delta` (inf: none); see the module docstring.

    `counts`: (3, regions, cells) T, L, E."""
    pooled, T, Tp, var = _ranked(counts)
    flat = pooled.ravel()
    order = np.argsort(flat, kind="stable")
    tail_t, tail_tp, tail_var = (np.cumsum(x.ravel()[order]) for x in (T, Tp, var))
    # a prefix may only end where the rate changes: cells of one rate are served together; never unknown ones
    ranked = flat[order]
    ends = np.flatnonzero(np.append(ranked[1:] != ranked[:-1], True) & np.isfinite(ranked))
    ok = (tail_t[ends] >= 30.0 / delta) & (tail_tp[ends] + _Z95 * np.sqrt(tail_var[ends]) <= delta * tail_t[ends])
    cut = np.full(counts.shape[1], math.inf)
    if not ok.any():
        return cut
    served = pooled <= ranked[ends[np.flatnonzero(ok)[-1]]]
    for g in range(len(cut)):
        # the region's rate falls with cosine, so its served cells are a tail; but a cell nothing is known about
        # is never served, so the cutoff is where the unbroken run of served cells from the top begins
        holes = np.flatnonzero(~served[g])
        first = holes[-1] + 1 if len(holes) else 0
        if first < served.shape[1]:
            cut[g] = float(EDGES[first])
    return cut


def estimate(counts: np.ndarray, cutoffs: np.ndarray) -> tuple[float, float]:
    """(point estimate, 95 % upper bound) of the false-hit rate of serving every candidate at or above its
    region's cutoff."""
    _, T, Tp, var = _ranked(counts)
    served = np.arange(CELLS - 1)[None, :] >= np.array([cell(c) - 1 if math.isfinite(c) else CELLS
                                                        for c in cutoffs])[:, None]
    n = T[served].sum()
    if n <= 0:
        return math.nan, math.nan
    point = float(Tp[served].sum() / n)
    return point, float(point + _Z95 * math.sqrt(var[served].sum()) / n)


@dataclass(frozen=True, slots=True)
class BoundDecision:
    action: Action  # hit: serve it; verify: ask the tier, then compare; judge: a miss, compare; miss: nothing
    cutoff: float  # the tenant's certified cutoff for this δ in the candidate's region (inf: none yet)
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
        self._cutoffs: dict[tuple[str, float], np.ndarray] = {}  # per region
        self._bounds: dict[str, set[float]] = {}  # the δs asked for per tenant (for the gauges)
        self._fresh: dict[str, int] = {}  # lookups counted per tenant since its cutoffs were last computed
        self._known: set[str] = set()  # tenants whose shared counts this process has read
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="tiergate-cache-errbound")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
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

    def cutoffs(self, tenant: str, delta: float) -> np.ndarray:
        """The tenant's certified cutoff for `delta` in each overlap region (inf: none)."""
        key = (tenant, delta)
        c = self._cutoffs.get(key)
        if c is None:
            c = self._cutoffs[key] = certified_cutoffs(self.counts(tenant), delta)
            self._bounds.setdefault(tenant, set()).add(delta)
        return c

    def cutoff(self, tenant: str, delta: float, overlap: float) -> float:
        """The cutoff a candidate with this word overlap has to reach."""
        return float(self.cutoffs(tenant, delta)[region(overlap)])

    def counts(self, tenant: str) -> np.ndarray:
        """Everyone's counts as last read, plus this process's since."""
        total = self._totals.get(tenant)
        local = self._local.get(tenant)
        if total is None:
            return local.copy() if local is not None else new_counts()
        return total + local if local is not None else total.copy()

    def decide(self, tenant: str, sim: float, overlap: float, delta: float, verify_rate: float,
               entry_threshold: float | None = None) -> BoundDecision:
        """What to do with the best candidate that passed the guards (at cosine `sim`, sharing `overlap` of its
        content words with the request); counts the lookup."""
        if sim < FLOOR:
            return BoundDecision("miss", math.inf, math.inf)
        self._add(tenant, _T, sim, overlap)
        c = self.cutoff(tenant, delta, overlap)
        threshold = max(c, entry_threshold or 0.0)
        if sim >= threshold:
            action: Action = "verify" if self._rng.random() < verify_rate else "hit"
        elif sim >= min(c, 1.0) - self.settings.judge_band:
            action = "judge"
        else:
            action = "miss"
        if math.isfinite(threshold):
            self.metrics.semantic_threshold.observe(threshold)
        return BoundDecision(action, c, threshold)

    def record(self, tenant: str, sim: float, overlap: float, wrong: bool, source: str) -> None:
        """A label for a candidate at cosine `sim` and word overlap `overlap`: its answer was right or wrong for
        the request."""
        self.metrics.verifications.labels(tenant, source, "wrong" if wrong else "right").inc()
        if sim < FLOOR:
            return
        self._add(tenant, _L, sim, overlap)
        if wrong:
            self._add(tenant, _E, sim, overlap)

    def seed(self, tenant: str, sims: np.ndarray, overlaps: np.ndarray, wrong: np.ndarray) -> None:
        """Labelled lookups known before any traffic (a calibration set): counted and labelled at once."""
        sims = np.asarray(sims, float)
        wrong = np.asarray(wrong, bool)
        keep = sims >= FLOOR
        at = (np.searchsorted(OVERLAP_EDGES, np.asarray(overlaps, float)[keep], side="right"),
              np.searchsorted(EDGES, sims[keep], side="right"))
        local = self._local_for(tenant)
        for row, which in ((_T, slice(None)), (_L, slice(None)), (_E, wrong[keep])):
            np.add.at(local[row], (at[0][which], at[1][which]), 1)
        self._changed(tenant)

    def _local_for(self, tenant: str) -> np.ndarray:
        local = self._local.get(tenant)
        if local is None:
            local = self._local[tenant] = new_counts()
        return local

    def _add(self, tenant: str, row: int, sim: float, overlap: float) -> None:
        self._local_for(tenant)[row, region(overlap), cell(sim)] += 1
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
                cuts = self.cutoffs(tenant, delta)
                point, upper = estimate(counts, cuts)
                label = f"{delta:g}"
                for g, c in enumerate(cuts.tolist()):
                    self.metrics.cutoff.labels(tenant, label, REGION_LABELS[g]).set(c)
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
