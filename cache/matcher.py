"""How the semantic cache decides which stored entry, if any, answers a request: the exact entry, else the
nearest ones in the request's namespace re-scored exactly, the best of which passes the guards (`cache.guards`),
fits the request's token budget and reaches the rule's threshold, or the error bound's verdict (`cache.verify`)
for rules with `max_false_hit_rate`. Every entry read is checked to be the tenant's own, whatever the index said.

The embedding a lookup made is kept for the `store` that follows its miss (`take_vector`), so a question is
embedded once. `score_many` applies the same decision to pairs of texts (the CLI's score-pairs).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tiergate.cache.batcher import EmbeddingBatcher, Vector
from tiergate.cache.errbound import FLOOR
from tiergate.cache.guards import Signature, overlap, signature, veto
from tiergate.cache.keys import RequestKey, answer_fits, normalize_text
from tiergate.cache.metrics import CacheMetrics
from tiergate.cache.settings import CacheSettings
from tiergate.cache.store import Store, StoreUnavailable
from tiergate.cache.types import CacheEntry, CacheHit
from tiergate.cache.verify import LookupResult, Verifier

if TYPE_CHECKING:
    from tiergate.cache.pairscore import PairScorer
    from tiergate.core.types import CacheRule

__all__ = ["Matcher", "PairScore"]

_STASH = 4096  # recent lookup embeddings kept for the store() that follows a miss


@dataclass(frozen=True, slots=True)
class PairScore:
    hit: bool
    similarity: float
    reason: str | None = None  # why not a hit: "below_threshold", a guard's name, "too_long", ...
    overlap: float = 1.0  # the share of content words in common (`cache.guards.overlap`)


class Matcher:
    """The lookup decision of one `SemanticCache` (which owns the store, the batcher and the verifier)."""

    def __init__(self, store: Store, batcher: EmbeddingBatcher | None, settings: CacheSettings,
                 metrics: CacheMetrics, verifier: Verifier, pair_scorer: PairScorer | None) -> None:
        self.backend = store
        self.batcher = batcher
        self.settings = settings
        self.metrics = metrics
        self.verifier = verifier
        self.pair_scorer = pair_scorer
        self._stash: OrderedDict[str, Vector] = OrderedDict()

    def take_vector(self, entry_id: str) -> Vector | None:
        """The embedding the lookup of `entry_id` made, if it is still kept (once: it is removed)."""
        return self._stash.pop(entry_id, None)

    def forget(self) -> None:
        """Drop the kept embeddings (after an invalidation or a reported wrong hit)."""
        self._stash.clear()

    async def find(self, key: RequestKey, rule: CacheRule) -> LookupResult:
        """The exact entry for `key`, else the best semantic one the guards, the budget and the rule allow.

        Raises `StoreUnavailable` when the store is down; the caller turns that (and timeouts) into a bypass."""
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

    def _remember(self, entry_id: str, vec: Vector) -> None:
        self._stash[entry_id] = vec
        self._stash.move_to_end(entry_id)
        while len(self._stash) > _STASH:
            self._stash.popitem(last=False)


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
