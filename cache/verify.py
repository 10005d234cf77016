"""Where the semantic cache learns whether its hits are right: error-bounded decisions, answer comparison and
client feedback (`SemanticCache` delegates here; the statistics are in `cache.errbound`).

- `decide`: for a rule with `max_false_hit_rate`, the error bound's verdict about the best candidate. A
  `verify` or `judge` verdict is a miss whose candidate is remembered (by the request's entry id) until the
  tier's answer for that request is offered to the cache; with `verify_mode: shadow` a `verify` verdict is a
  hit (reason "verify") whose request the caller also sends to the tier in the background;
- `settle`: then the two answers are compared (`cache.judge`), the label counted, and a wrong entry's own
  threshold raised above that similarity;
- `served` / `feedback`: which entry answered which request, and a client's report that it was wrong.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from tiergate.cache.errbound import ErrorBound
from tiergate.cache.judge import Judge
from tiergate.cache.keys import RequestKey
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.settings import CacheSettings
from tiergate.cache.shared import HitRecord, SharedState
from tiergate.cache.store import Store
from tiergate.cache.types import CachedAnswer, CacheEntry, CacheHit, CacheStatus

if TYPE_CHECKING:
    from tiergate.core.types import CacheRule

__all__ = ["Feedback", "LookupResult", "Verifier"]

log = structlog.get_logger("tiergate.cache")

_PENDING = 4096  # candidates waiting for their request's tier answer (oldest dropped)
_TIGHTEN = 1e-4  # an entry found wrong at cosine s is served afterwards only from s + this


@dataclass(frozen=True, slots=True)
class LookupResult:
    hit: CacheHit | None
    status: CacheStatus  # what the x-tiergate-cache header says
    reason: str | None = None  # why it bypassed (not cacheable, store down, ...) or missed (verify, judge); on a
    # hit, "verify": a shadow check, the caller also sends the request to the tier and offers its answer
    key: RequestKey | None = None  # hand it back to `store` so the request is not hashed twice


@dataclass(frozen=True, slots=True)
class Feedback:
    """What `POST /v1/cache/feedback` did for a request the cache answered."""

    entry_id: str
    kind: str  # hit-exact | hit-semantic
    removed: int  # entries invalidated (0: it was gone already)
    threshold: float | None  # the entry's own threshold now (semantic hits)
    already_reported: bool  # reported before: nothing was changed this time


@dataclass(frozen=True, slots=True)
class _Pending:
    """A candidate whose answer is compared with the tier's once it has answered (verify or judge)."""

    tenant: str
    entry_id: str
    similarity: float
    overlap: float
    answer: str
    source: str  # verify | judge


class Verifier:
    def __init__(self, store: Store, shared: SharedState, judge: Judge | None, settings: CacheSettings,
                 metrics: CacheMetrics, axis: str = "") -> None:
        self.store = store
        self.shared = shared
        self.judge = judge
        self.metrics = metrics
        self.errbound = ErrorBound(shared, settings, metrics)
        # The axis the bound decides on: "" for the cosine, a verifier's id for its bound score. Evidence and
        # entry thresholds learnt on one axis mean nothing on another, so each axis keeps its own.
        self.axis = axis
        self._pending: OrderedDict[str, _Pending] = OrderedDict()

    async def start(self) -> None:
        await self.errbound.start()

    async def stop(self) -> None:
        await self.errbound.stop()

    def scoped(self, name: str) -> str:
        """A tenant's or an entry's name for the evidence of the current axis."""
        return f"{name}@{self.axis}" if self.axis else name

    def forget(self) -> None:
        self._pending.clear()

    # -- the decision --------------------------------------------------------------------------------------
    async def decide(self, key: RequestKey, e: CacheEntry, sim: float, overlap: float, rule: CacheRule,
                     hit: LookupResult) -> LookupResult:
        """The error bound's verdict about the best candidate that passed the guards, at cosine `sim` and word
        overlap `overlap` (`cache.guards.overlap`)."""
        delta = float(rule.max_false_hit_rate)  # type: ignore[arg-type]
        tenant, entry = self.scoped(key.tenant), self.scoped(e.id)
        await self.errbound.ensure(tenant)
        own = None
        if sim >= self.errbound.cutoff(tenant, delta, overlap):  # only a would-be hit needs its entry's own
            own = await self.shared.entry_threshold(entry)
        verdict = self.errbound.decide(tenant, sim, overlap, delta, rule.verify_rate, own)
        shadow = verdict.action == "verify" and rule.verify_mode == "shadow"
        if verdict.action == "hit" or (shadow and self.judge is None):  # nothing to check it with: a plain hit
            return hit
        if verdict.action in ("verify", "judge") and self.judge is not None:
            self._pending[key.entry_id] = _Pending(tenant, entry, sim, overlap, e.answer.text, verdict.action)
            self._pending.move_to_end(key.entry_id)
            while len(self._pending) > _PENDING:
                self._pending.popitem(last=False)
            if shadow:  # served now; the caller also sends the request to the tier and offers its answer (`store`)
                return LookupResult(hit.hit, hit.status, "verify", key)
            return LookupResult(None, "miss", verdict.action, key)
        return LookupResult(None, "miss", None, key)

    async def settle(self, key: RequestKey, answer: CachedAnswer) -> None:
        """The tier answered a request whose lookup left a candidate to compare: judge, count, tighten."""
        pending = self._pending.pop(key.entry_id, None)
        if pending is None or self.judge is None:
            return
        same = await self.judge.same(key.text, pending.answer, answer.text)
        if same is None:
            self.metrics.errors.labels("judge").inc()
            return
        self.errbound.record(pending.tenant, pending.similarity, pending.overlap, not same, pending.source)
        if not same:
            await self.shared.raise_entry_threshold(pending.entry_id, pending.similarity + _TIGHTEN)

    # -- feedback ----------------------------------------------------------------------------------------------
    async def served(self, request_id: str, tenant: str, hit: CacheHit) -> None:
        try:
            axis = hit.similarity if hit.bound_score is None else hit.bound_score  # what the bound decided on
            await self.shared.remember_hit(request_id, HitRecord(tenant, hit.entry_id, hit.namespace, hit.kind,
                                                                 axis, hit.overlap))
        except Exception as exc:  # Redis down: this hit cannot be reported later, nothing else is lost
            self.metrics.errors.labels("remember_hit").inc()
            log.debug("cache_remember_hit_failed", error=repr(exc))

    async def feedback(self, tenant: str, request_id: str) -> Feedback | None:
        """The entry is invalidated and, for a semantic hit, its threshold rises above that similarity and the
        label counts for the error bound. None when this tenant has no such request on record (unknown,
        expired, or another tenant's): nothing changes. Raises `StoreUnavailable` when the shared state is
        unreachable."""
        record, reported = await self.shared.hit(tenant, request_id)
        if record is None:
            self.metrics.feedback.labels("unknown").inc()
            return None
        if reported:
            self.metrics.feedback.labels("repeated").inc()
            return Feedback(record.entry_id, record.kind, 0, None, True)
        removed = await self.store.delete(record.entry_id, record.namespace or None)
        threshold = None
        if record.kind == "hit-semantic":
            threshold = await self.shared.raise_entry_threshold(self.scoped(record.entry_id),
                                                                record.similarity + _TIGHTEN)
            self.errbound.record(self.scoped(tenant), record.similarity, record.overlap, True, "feedback")
        self.metrics.feedback.labels("applied").inc()
        self.metrics.invalidations.labels("feedback").inc(removed)
        log.info("cache_feedback", tenant=tenant, entry=record.entry_id, kind=record.kind, removed=removed,
                 threshold=threshold)
        return Feedback(record.entry_id, record.kind, removed, threshold, False)
