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

That decision is `cache.matcher`'s; this class adds the time limit and error handling around it, the store
side (what is stored, with which embedding), invalidation, feedback and the in-process index's expiry.

Nothing here raises on the request path: a down or slow store, a timeout or a bug becomes a bypass (the
request goes upstream) and a metric. Invalidation is an admin operation and does raise
`StoreUnavailable` so the admin sees that it did not happen.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec
import structlog

from tiergate.cache.batcher import EmbeddingBatcher
from tiergate.cache.judge import EmbeddingJudge, Judge
from tiergate.cache.keys import RequestKey, Route, request_key, tenant_tag, uncacheable_reason
from tiergate.cache.lexicon import lexicon
from tiergate.cache.matcher import Matcher, PairScore
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
        self.matcher = Matcher(store, batcher, self.settings, self.metrics, self.verifier, pair_scorer)
        self._sweeper: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.batcher is not None:
            await asyncio.to_thread(lexicon)  # the guards' WordNet (~1 s), read here rather than on a request
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

    async def lookup(self, req: ParsedRequest, tenant: str, rule: CacheRule, *,
                     route: Route | None = None) -> CacheHit | None:
        return (await self.check(req, tenant, rule, route=route)).hit

    async def check(self, req: ParsedRequest, tenant: str, rule: CacheRule, *,
                    route: Route | None = None) -> LookupResult:
        """`lookup` plus the status for the response header and why it bypassed. Never raises.

        `route` is the policy's decision for the request (its tiers and effective max_tokens): the gateway
        always gives it, since it changes the answer (`cache.keys.Route`)."""
        started = time.perf_counter()
        key = None
        try:
            reason = uncacheable_reason(req, rule)
            if reason is not None:
                self.metrics.skipped.labels(reason).inc()
                return LookupResult(None, "bypass", reason)
            key = request_key(req, tenant, route)
            if self.backend.in_process and (self.batcher is None or not rule.semantic):
                result = await self.matcher.find(key, rule)  # one dict read: nothing to time out
            else:
                async with asyncio.timeout(self.settings.lookup_timeout_s):
                    result = await self.matcher.find(key, rule)
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
                    key: RequestKey | None = None, *, route: Route | None = None) -> bool:
        """Offer a complete answer; True when it was stored. Never raises.

        `key` is the one `check` returned for this request (computed again, with `route`, when not given). An
        answer from a tier outside the key's route (a fallback's) is not stored: it would be served to later
        requests as the answer of the tier the policy chose. When the lookup left a candidate to compare with
        (error-bounded rules: verify, judge), the comparison runs here too."""
        stored = False
        try:
            reason = uncacheable_reason(req, rule)
            complete = answer.finish_reason in _STORABLE_FINISH and bool(answer.text)
            if reason is None and not complete:
                reason = "incomplete"
            if reason is None and rule.ttl_s <= 0:
                reason = "ttl"
            if key is None or key.tenant != tenant:
                key = request_key(req, tenant, route)
            if reason is None and key.tiers is not None and answer.tier not in key.tiers:
                reason = "off_route"
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
            self.matcher.forget()
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
        self.matcher.forget()
        self.verifier.forget()
        self.metrics.invalidations.labels(scope).inc(n)
        self.metrics.entries.set(len(self.index))
        log.info("cache_invalidated", scope=scope, entries=n)
        return n

    async def score(self, a: str, b: str, rule: CacheRule) -> PairScore:
        """Would a stored `a` answer a request for `b` under `rule`? (the CLI's score-pairs)."""
        return (await self.score_many([(a, b)], rule))[0]

    async def score_many(self, pairs: list[tuple[str, str]], rule: CacheRule) -> list[PairScore]:
        return await self.matcher.score_many(pairs, rule)

    # -- internals ------------------------------------------------------------------------------------------
    async def _store(self, key: RequestKey, answer: CachedAnswer, rule: CacheRule) -> bool:
        if len(key.text) > self.settings.max_stored_chars or len(answer.text) > self.settings.max_answer_chars:
            return False
        vec = self.matcher.take_vector(key.entry_id)
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
