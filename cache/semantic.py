"""The semantic cache the gateway talks to: exact, then semantic lookup; store; invalidate.

Lookup order for a cacheable request (see `cache.keys` for what is cacheable and how keys are made):
1. exact: the entry whose id is the hash of (namespace, normalised text): one store read;
2. semantic: embed the text (batched, off the event loop), take the nearest entries *in the same
   namespace* from the in-process index, re-score them exactly with their stored vectors, and accept the
   best one that reaches the rule's threshold, passes every guard (`cache.guards`) and whose answer fits
   the request's token budget.

Nothing here raises on the request path: a down or slow store, a timeout or a bug becomes a bypass (the
request goes upstream) and a metric. Invalidation is an admin operation and does raise
`StoreUnavailable` so the admin sees that it did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec
import numpy as np
import structlog

from cache.batcher import EmbeddingBatcher, Vector
from cache.guards import signature, veto
from cache.keys import RequestKey, answer_fits, normalize_text, request_key, tenant_tag, uncacheable_reason
from cache.metrics import CacheMetrics, default_metrics
from cache.settings import CacheSettings
from cache.store import Store, StoreUnavailable
from cache.types import CachedAnswer, CacheEntry, CacheHit, CacheStatus

if TYPE_CHECKING:
    from core.types import CacheRule
    from core.wire import ParsedRequest

__all__ = ["LookupResult", "PairScore", "SemanticCache"]

log = structlog.get_logger("tiergate.cache")

_STORABLE_FINISH = ("stop", "length")
_STASH = 4096  # recent lookup embeddings kept for the store() that follows a miss


@dataclass(frozen=True, slots=True)
class LookupResult:
    hit: CacheHit | None
    status: CacheStatus  # what the x-tiergate-cache header says
    reason: str | None = None  # why it bypassed (not cacheable, store down, ...)
    key: RequestKey | None = None  # hand it back to `store` so the request is not hashed twice


@dataclass(frozen=True, slots=True)
class PairScore:
    hit: bool
    similarity: float
    reason: str | None = None  # why not a hit: "below_threshold", a guard's name, "too_long", ...


class SemanticCache:
    def __init__(self, store: Store, batcher: EmbeddingBatcher | None, *,
                 settings: CacheSettings | None = None, metrics: CacheMetrics | None = None) -> None:
        self.backend = store
        self.index = store.index
        self.batcher = batcher
        self.settings = settings or CacheSettings()
        self.metrics = metrics or default_metrics()
        self._stash: OrderedDict[str, Vector] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.batcher is not None:
            await self.batcher.start()
        await self.backend.start()
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="tiergate-cache-sweeper")

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.backend.stop()
        if self.batcher is not None:
            await self.batcher.stop()

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

        `key` is the one `check` returned for this request (computed again when not given)."""
        try:
            reason = uncacheable_reason(req, rule)
            if reason is None and (answer.finish_reason not in _STORABLE_FINISH or not answer.text):
                reason = "incomplete"
            if reason is None and rule.ttl_s <= 0:
                reason = "ttl"
            if reason is not None:
                self.metrics.stores.labels("skipped").inc()
                return False
            if not self.backend.available():
                self.metrics.stores.labels("bypass").inc()
                return False
            if key is None or key.tenant != tenant:
                key = request_key(req, tenant)
            async with asyncio.timeout(self.settings.lookup_timeout_s):
                stored = await self._store(key, answer, rule)
            self.metrics.stores.labels("stored" if stored else "skipped").inc()
            return stored
        except (StoreUnavailable, TimeoutError):
            self.metrics.stores.labels("bypass").inc()
        except Exception as exc:
            self.metrics.errors.labels("store").inc()
            log.exception("cache_store_error", error=repr(exc))
        return False

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
                reason = self._judge(sim, a, b, rule.threshold)
                out.append(PairScore(reason is None, sim, reason))
        return out

    # -- internals ------------------------------------------------------------------------------------------
    async def _lookup(self, key: RequestKey, rule: CacheRule) -> LookupResult:
        if not self.backend.available():
            raise StoreUnavailable("store down")
        (exact,) = await self.backend.get_many([key.entry_id])
        if exact is not None and self._owned(exact, key) and exact.text == key.text and answer_fits(
                exact.answer, exact.max_tokens, key.max_tokens):
            return LookupResult(CacheHit(exact.answer, "hit-exact", 1.0, exact.id), "hit-exact", key=key)
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
        margin = 0.02  # HNSW similarities are int8 approximations: re-scored exactly below
        cands = [(eid, s) for eid, s in self.index.search(key.namespace, vec.values, self.settings.candidates)
                 if s >= rule.threshold - margin and eid != key.entry_id]
        if not cands:
            return miss
        entries = await self.backend.get_many([eid for eid, _ in cands])
        scored = []
        for (_, approx), e in zip(cands, entries, strict=True):
            if e is None or not self._owned(e, key):
                continue
            sim = approx
            if len(e.embedding) == 4 * vec.values.shape[0]:
                sim = float(np.dot(np.frombuffer(e.embedding, "<f4"), vec.values))
            scored.append((sim, e))
        scored.sort(key=lambda se: -se[0])
        for sim, e in scored:
            reason = self._judge(sim, e.text, key.text, rule.threshold)
            if reason is None and answer_fits(e.answer, e.max_tokens, key.max_tokens):
                return LookupResult(CacheHit(e.answer, "hit-semantic", round(sim, 4), e.id), "hit-semantic",
                                    key=key)
        return miss

    def _judge(self, sim: float, stored: str, asked: str, threshold: float) -> str | None:
        if sim < threshold:
            return "below_threshold"
        guard = veto(signature(stored), signature(asked), self.settings.guards)
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
