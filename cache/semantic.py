"""The semantic cache the gateway talks to: exact, then semantic lookup; store; invalidate; feedback.

Lookup order for a cacheable request (see `cache.keys` for what is cacheable and how keys are made):
1. exact: the entry whose id is the hash of (namespace, normalised text): one store read;
2. semantic: embed the text (batched, off the event loop), take the nearest entries *in the same
   namespace* from the store (the in-process index, or Redis 8's VSIM), re-score them exactly with their
   stored vectors, and take the best one that passes every guard (`cache.guards`) and whose answer fits the
   request's token budget. It is a hit when it reaches the rule's threshold; or, for a rule with
   `max_false_hit_rate`, when the error bound says so (`cache.errbound`: the cutoff the evidence certifies
   for that bound, and the entry's own threshold), and then a sampled share of such would-be hits, and the
   near misses, have their answers compared with the tier's (`cache.judge`) once the tier has answered.

Nothing here raises on the request path: a down or slow store, a timeout or a bug becomes a bypass (the
request goes upstream) and a metric. Invalidation is an admin operation and does raise
`StoreUnavailable` so the admin sees that it did not happen.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import structlog

from tiergate.cache.batcher import EmbeddingBatcher, Vector
from tiergate.cache.errbound import FLOOR
from tiergate.cache.guards import Signature, overlap, signature, veto
from tiergate.cache.judge import EmbeddingJudge, Judge
from tiergate.cache.keys import (
    RequestKey,
    answer_fits,
    normalize_text,
    request_key,
    tenant_tag,
    uncacheable_reason,
)
from tiergate.cache.metrics import CacheMetrics, default_metrics
from tiergate.cache.settings import CacheSettings
from tiergate.cache.shared import MemoryShared, SharedState
from tiergate.cache.store import Store, StoreUnavailable
from tiergate.cache.types import CachedAnswer, CacheEntry, CacheHit
from tiergate.cache.verify import Feedback, LookupResult, Verifier
from tiergate.core.tasks import cancel_and_wait

if TYPE_CHECKING:
    from tiergate.cache.pairscore import PairScorer
    from tiergate.core.types import CacheRule
    from tiergate.core.wire import ParsedRequest

__all__ = ["Feedback", "LookupResult", "PairScore", "SemanticCache"]

log = structlog.get_logger("tiergate.cache")

_STORABLE_FINISH = ("stop", "length")
_STASH = 4096  # recent lookup embeddings kept for the store() that follows a miss


@dataclass(frozen=True, slots=True)
class PairScore:
    hit: bool
    similarity: float
    reason: str | None = None  # why not a hit: "below_threshold", a guard's name, "too_long", ...
    overlap: float = 1.0  # the share of content words in common (`cache.guards.overlap`)


class SemanticCache:
    def __init__(self, store: Store, batcher: EmbeddingBatcher | None, *,
                 settings: CacheSettings | None = None, metrics: CacheMetrics | None = None,
                 shared: SharedState | None = None, judge: Judge | None = None,
                 pair_scorer: PairScorer | None = None) -> None:
        self.backend = store
        self.index = store.index
        self.batcher = batcher
        self.settings = settings or CacheSettings()
        self.metrics = metrics or default_metrics()
        self.verifier = Verifier(store, shared or MemoryShared(self.settings.entry_memory_s,
                                                               self.settings.feedback_ttl_s),
                                 judge or (EmbeddingJudge(batcher, self.settings.judge_threshold) if batcher else None),
                                 self.settings, self.metrics, pair_scorer.axis if pair_scorer is not None else "")
        self.errbound = self.verifier.errbound
        self.pair_scorer = pair_scorer  # error-bounded rules: a cross-encoder's bound score replaces the cosine
        self.shared = self.verifier.shared
        self._stash: OrderedDict[str, Vector] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.batcher is not None:
            await self.batcher.start()
        await self.backend.start()
        await self.verifier.start()
        if self._sweeper is None:  # the in-process index's expiry (empty on Redis 8: nothing to do)
            self._sweeper = asyncio.create_task(self._sweep(), name="tiergate-cache-sweeper")

    async def stop(self) -> None:
        await cancel_and_wait(self._sweeper)
        self._sweeper = None
        await self.verifier.stop()
        await self.backend.stop()
        if self.batcher is not None:
            await self.batcher.stop()
        if self.pair_scorer is not None:
            self.pair_scorer.close()

    def describe(self) -> dict[str, object]:
        """What `/readyz` shows: the store serving, and the verifier when error-bounded rules use one."""
        out = self.backend.describe()
        if self.pair_scorer is not None:
            out["verifier"] = {"path": str(self.pair_scorer.path), "axis": self.pair_scorer.axis,
                               "members": self.pair_scorer.members}
        return out

    # -- request path -----------------------------------------------------------------------------------
    def accepts(self, req: ParsedRequest, rule: CacheRule) -> bool:
        """Whether the rule lets this request be looked up and stored at all (temperature, n, ...)."""
        return uncacheable_reason(req, rule) is None

    async def lookup(self, req: ParsedRequest, tenant: str, rule: CacheRule) -> CacheHit | None:
        return (await self.check(req, tenant, rule)).hit

    async def check(self, req: ParsedRequest, tenant: str, rule: CacheRule) -> LookupResult:
        """`lookup` plus the status for the response header and why it bypassed. Never raises."""
        started = time.perf_counter()
        key = None
        try:
            reason = uncacheable_reason(req, rule)
            if reason is not None:
                self.metrics.skipped.labels(reason).inc()
                return LookupResult(None, "bypass", reason)
            key = request_key(req, tenant)
            if self.backend.in_process and (self.batcher is None or not rule.semantic):
                result = await self._lookup(key, rule)  # one dict read: nothing to time out
            else:
                async with asyncio.timeout(self.settings.lookup_timeout_s):
                    result = await self._lookup(key, rule)
        except StoreUnavailable:  # down, or slower than its per-command timeout: counted by reason
            self.metrics.skipped.labels("store_unavailable").inc()
            result = LookupResult(None, "bypass", "store_unavailable", key)
        except TimeoutError:
            self.metrics.errors.labels("lookup_timeout").inc()
            result = LookupResult(None, "bypass", "timeout", key)
        except Exception as exc:
            self.metrics.errors.labels("lookup").inc()
            log.exception("cache_lookup_error", error=repr(exc))
            result = LookupResult(None, "bypass", "error")
        self.metrics.looked_up(result.status, time.perf_counter() - started)
        return result

    async def store(self, req: ParsedRequest, tenant: str, rule: CacheRule, answer: CachedAnswer,
                    key: RequestKey | None = None) -> bool:
        """Offer a complete answer; True when it was stored. Never raises.

        `key` is the one `check` returned for this request (computed again when not given). When the lookup
        left a candidate to compare with (error-bounded rules: verify, judge), the comparison runs here too."""
        stored = False
        try:
            reason = uncacheable_reason(req, rule)
            complete = answer.finish_reason in _STORABLE_FINISH and bool(answer.text)
            if reason is None and not complete:
                reason = "incomplete"
            if reason is None and rule.ttl_s <= 0:
                reason = "ttl"
            if key is None or key.tenant != tenant:
                key = request_key(req, tenant)
            if reason is not None:
                self.metrics.stores.labels("skipped").inc()
            elif not self.backend.available():
                self.metrics.stores.labels("bypass").inc()
            else:
                async with asyncio.timeout(self.settings.lookup_timeout_s):
                    stored = await self._store(key, answer, rule)
                self.metrics.stores.labels("stored" if stored else "skipped").inc()
            if complete:
                await self.verifier.settle(key, answer)  # a verified or judged candidate: compare the answers
        except (StoreUnavailable, TimeoutError):
            self.metrics.stores.labels("bypass").inc()
        except Exception as exc:
            self.metrics.errors.labels("store").inc()
            log.exception("cache_store_error", error=repr(exc))
        return stored

    async def served(self, request_id: str, tenant: str, hit: CacheHit) -> None:
        """Remember which entry answered a request, for `feedback` (after the response; never raises)."""
        await self.verifier.served(request_id, tenant, hit)

    async def feedback(self, tenant: str, request_id: str) -> Feedback | None:
        """A client reports that the answer to `request_id` (a cache hit it got) was wrong: see `Verifier.feedback`."""
        result = await self.verifier.feedback(tenant, request_id)
        if result is not None and not result.already_reported:
            self._stash.clear()
        return result

    # -- admin ----------------------------------------------------------------------------------------------
    async def invalidate(self, tenant: str | None = None, entry_id: str | None = None) -> int:
        """Remove one entry, a tenant's entries, or everything (no arguments); returns how many."""
        if entry_id is not None:
            if tenant is not None and not entry_id.startswith(tenant_tag(tenant) + "-"):
                return 0  # that entry is not this tenant's
            n, scope = await self.backend.delete(entry_id), "entry"
        elif tenant is not None:
            n, scope = await self.backend.delete_tenant(tenant), "tenant"
        else:
            n, scope = await self.backend.delete_all(), "all"
        self._stash.clear()
        self.verifier.forget()
        self.metrics.invalidations.labels(scope).inc(n)
        self.metrics.entries.set(len(self.index))
        log.info("cache_invalidated", scope=scope, entries=n)
        return n

    async def score(self, a: str, b: str, rule: CacheRule) -> PairScore:
        """Would a stored `a` answer a request for `b` under `rule`? (the CLI's score-pairs)."""
        return (await self.score_many([(a, b)], rule))[0]

    async def score_many(self, pairs: list[tuple[str, str]], rule: CacheRule) -> list[PairScore]:
        texts = [normalize_text(t) for pair in pairs for t in pair]
        if not rule.enabled:
            return [PairScore(False, 0.0, "disabled") for _ in pairs]
        need = rule.semantic and self.batcher is not None
        vectors = await self.batcher.embed_many(texts) if need else []  # type: ignore[union-attr]
        out = []
        for i in range(len(pairs)):
            a, b = texts[2 * i], texts[2 * i + 1]
            if not vectors:
                out.append(PairScore(a == b, 1.0 if a == b else 0.0, None if a == b else "semantic_off"))
                continue
            va, vb = vectors[2 * i], vectors[2 * i + 1]
            sim = float(np.dot(va.values, vb.values))
            if a == b:
                out.append(PairScore(True, sim))
            elif va.truncated or vb.truncated or max(len(a), len(b)) > self.settings.max_semantic_chars:
                out.append(PairScore(False, sim, "too_long"))
            elif not a.strip() or not b.strip():
                out.append(PairScore(False, sim, "empty"))
            else:
                sa, sb = signature(a), signature(b)
                reason = self._judge(sim, sa, sb, rule.threshold)
                out.append(PairScore(reason is None, sim, reason, round(overlap(sa, sb), 4)))
        return out

    # -- internals ------------------------------------------------------------------------------------------
    async def _lookup(self, key: RequestKey, rule: CacheRule) -> LookupResult:
        if not self.backend.available():
            raise StoreUnavailable("store down")
        (exact,) = await self.backend.get_many(key.namespace, [key.entry_id])
        if exact is not None and self._owned(exact, key) and exact.text == key.text and answer_fits(
                exact.answer, exact.max_tokens, key.max_tokens):
            return LookupResult(CacheHit(exact.answer, "hit-exact", 1.0, exact.id, exact.namespace), "hit-exact",
                                key=key)
        miss = LookupResult(None, "miss", key=key)
        if not rule.semantic or self.batcher is None:
            return miss
        if not key.semantic_ok:
            self.metrics.semantic_skipped.labels("no_question").inc()
            return miss
        if len(key.text) > self.settings.max_semantic_chars:
            self.metrics.semantic_skipped.labels("too_long").inc()
            return miss
        vec = await self.batcher.embed(key.text)
        if vec.truncated:
            self.metrics.semantic_skipped.labels("too_long").inc()
            return miss
        self._remember(key.entry_id, vec)
        bounded = rule.max_false_hit_rate is not None
        floor = FLOOR if bounded else rule.threshold
        margin = 0.02  # approximate (int8) similarities from the index: re-scored exactly below
        found = await self.backend.nearest(key.namespace, vec.values, self.settings.candidates, floor - margin)
        scored = []
        for e, approx in found:
            if e.id == key.entry_id or not self._owned(e, key):
                continue
            if e.embedding:
                if len(e.embedding) != 4 * vec.values.shape[0]:
                    continue  # another embedder's vector: not comparable, never a hit
                sim = float(np.dot(np.frombuffer(e.embedding, "<f4"), vec.values))
            else:
                sim = approx
            scored.append((sim, e))
        scored.sort(key=lambda se: -se[0])
        if not scored:
            return miss
        asked = signature(key.text)
        for sim, e in scored:
            stored = signature(e.text)
            if self._judge(sim, stored, asked, floor) is not None or not answer_fits(
                    e.answer, e.max_tokens, key.max_tokens):
                continue
            shared = round(overlap(stored, asked), 4)
            if not bounded:
                return LookupResult(CacheHit(e.answer, "hit-semantic", round(sim, 4), e.id, e.namespace, shared),
                                    "hit-semantic", key=key)
            score = await self._bound_score(sim, e.text, key.text)
            hit = LookupResult(CacheHit(e.answer, "hit-semantic", round(sim, 4), e.id, e.namespace, shared,
                                        None if score is None else round(score, 6)), "hit-semantic", key=key)
            # the best one the guards let through, at its bound score (or cosine)
            return await self.verifier.decide(key, e, sim if score is None else score, shared, rule, hit)
        return miss

    async def _bound_score(self, sim: float, cached: str, asked: str) -> float | None:
        """The verifier's bound score of a candidate, or None without a verifier (the bound uses the cosine)."""
        if self.pair_scorer is None:
            return None
        started = time.perf_counter()
        score = await self.pair_scorer.bound_score(sim, cached, asked)
        self.metrics.verifier_seconds.observe(time.perf_counter() - started)
        return score

    def _judge(self, sim: float, stored: Signature, asked: Signature, threshold: float) -> str | None:
        if sim < threshold:
            return "below_threshold"
        guard = veto(stored, asked, self.settings.guards)
        if guard is not None:
            self.metrics.vetoes.labels(guard).inc()
        return guard

    def _owned(self, entry: CacheEntry, key: RequestKey) -> bool:
        """Tenant isolation, checked on every entry read, whatever the index said."""
        if entry.tenant == key.tenant and entry.namespace == key.namespace:
            return True
        self.metrics.errors.labels("foreign_entry").inc()
        return False

    async def _store(self, key: RequestKey, answer: CachedAnswer, rule: CacheRule) -> bool:
        if len(key.text) > self.settings.max_stored_chars:
            return False
        vec = self._stash.pop(key.entry_id, None)
        semantic = rule.semantic and key.semantic_ok and self.batcher is not None
        if vec is None and semantic and len(key.text) <= self.settings.max_semantic_chars:
            vec = await self.batcher.embed(key.text)  # type: ignore[union-attr]
        now = time.time()
        usable = vec is not None and semantic and not vec.truncated
        entry = CacheEntry(
            id=key.entry_id, tenant=key.tenant, namespace=key.namespace, text=key.text,
            answer=answer if answer.created else _stamped(answer, now),
            embedding=vec.values.astype("<f4").tobytes() if usable else b"",  # type: ignore[union-attr]
            max_tokens=key.max_tokens, created=now, expires_at=now + rule.ttl_s,
        )
        evicted = await self.backend.put(entry, vec.values if usable else None)  # type: ignore[union-attr]
        if evicted:
            self.metrics.evictions.inc(evicted)
        self.metrics.entries.set(len(self.index))
        return True

    def _remember(self, entry_id: str, vec: Vector) -> None:
        self._stash[entry_id] = vec
        self._stash.move_to_end(entry_id)
        while len(self._stash) > _STASH:
            self._stash.popitem(last=False)

    def _housekeeping(self) -> None:
        """Off the event loop: drop expired entries in small lock holds, then grow the HNSW graphs."""
        while self.index.expire(limit=1000) == 1000:
            pass
        self.index.maintain()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_every_s)
            try:
                await asyncio.to_thread(self._housekeeping)
                self.metrics.entries.set(len(self.index))
            except Exception as exc:
                self.metrics.errors.labels("sweep").inc()
                log.exception("cache_sweep_error", error=repr(exc))


def _stamped(answer: CachedAnswer, now: float) -> CachedAnswer:
    return msgspec.structs.replace(answer, created=int(now))
