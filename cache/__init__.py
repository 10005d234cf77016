"""tiergate's semantic cache: exact and semantic hits that are right, shared by every gateway replica.

    cache = build_cache(settings.redis_url, settings.embedder)   # at start-up
    await cache.start()
    route = Route.of(decision, max_tokens)                       # the tiers and the effective budget: keyed too
    result = await cache.check(req, tenant, decision.cache, route=route)  # hit + header status, never raises
    ...
    await cache.store(req, tenant, decision.cache, answer, result.key)   # after a complete answer, never raises
    await cache.served(request_id, tenant, hit)                  # after a hit: it can be reported wrong later
    await cache.feedback(tenant, request_id)                     # "that hit was wrong": invalidate, tighten
    await cache.invalidate(tenant="acme")                        # admin; raises StoreUnavailable if Redis is down
    await cache.stop()
"""

from __future__ import annotations

import os
from pathlib import Path

import structlog

from tiergate.cache.batcher import EmbeddingBatcher
from tiergate.cache.embedder import EmbedderError, OnnxEmbedder
from tiergate.cache.index import VectorIndex
from tiergate.cache.judge import HttpJudge, Judge
from tiergate.cache.keys import Route
from tiergate.cache.matcher import PairScore
from tiergate.cache.metrics import CacheMetrics, default_metrics
from tiergate.cache.pairscore import PairScorer, VerifierError
from tiergate.cache.redis.store import RedisStore
from tiergate.cache.semantic import Feedback, LookupResult, SemanticCache
from tiergate.cache.settings import DEFAULT_GUARDS, DEFAULT_THRESHOLD, CacheSettings
from tiergate.cache.shared import RedisShared
from tiergate.cache.store import MemoryStore, StoreUnavailable
from tiergate.cache.types import CachedAnswer, CacheEntry, CacheHit, CacheStatus

__all__ = [
    "DEFAULT_GUARDS",
    "DEFAULT_THRESHOLD",
    "CacheEntry",
    "CacheHit",
    "CacheMetrics",
    "CacheSettings",
    "CacheStatus",
    "CachedAnswer",
    "EmbedderError",
    "Feedback",
    "HttpJudge",
    "LookupResult",
    "PairScore",
    "Route",
    "SemanticCache",
    "StoreUnavailable",
    "VerifierError",
    "build_cache",
]

log = structlog.get_logger("tiergate.cache")


def build_cache(
    redis_url: str | None,
    embedder_path: str | os.PathLike[str] | None,
    *,
    settings: CacheSettings | None = None,
    metrics: CacheMetrics | None = None,
    embedder: OnnxEmbedder | None = None,
    judge: Judge | None = None,
    verifier_path: str | os.PathLike[str] | None = None,
    pair_scorer: PairScorer | None = None,
) -> SemanticCache:
    """A cache on Redis (shared by replicas) or in process (redis_url None).

    `embedder_path` is the folder written by `tiergate cache export-embedder` (or a sentence-transformers
    folder / Hugging Face name with an ONNX model). None gives an exact-match-only cache; a path that cannot
    be loaded raises `EmbedderError` with what to do, so a misconfigured gateway fails at start-up, not later.
    Pass `embedder` to share one loaded model between caches (tests, benchmarks), and `judge` to compare answers
    for error-bounded rules with something else than the embedder (`HttpJudge`: an operator's model).
    `verifier_path`: a folder written by `tiergate cache train-verifier`; error-bounded rules then decide on its
    bound score instead of the cosine (`cache.pairscore`). One that cannot be loaded raises `VerifierError`.
    Pass `pair_scorer` to use one already loaded (tests, benchmarks).
    """
    settings = settings or CacheSettings()
    metrics = metrics or default_metrics()
    if embedder is None and embedder_path is not None:
        embedder = OnnxEmbedder.load(Path(embedder_path) if Path(embedder_path).exists() else str(embedder_path))
    if embedder is None:
        log.warning("cache_exact_only", reason="no embedder configured")
    batcher = (
        EmbeddingBatcher(embedder, metrics, linger_ms=settings.embed_linger_ms, max_batch=settings.embed_max_batch)
        if embedder is not None else None
    )
    scorer = pair_scorer
    if verifier_path is not None:
        scorer = PairScorer.load(Path(verifier_path))
        log.info("cache_verifier_loaded", path=str(verifier_path), members=scorer.members)
    index = VectorIndex(embedder.dim if embedder is not None else 384, hnsw_at=settings.hnsw_at)
    if redis_url:
        store = RedisStore(redis_url, index, settings, metrics)
        return SemanticCache(store, batcher, settings=settings, metrics=metrics, shared=RedisShared(store),
                             judge=judge, pair_scorer=scorer)
    memory = MemoryStore(index, max_entries=settings.max_entries)
    return SemanticCache(memory, batcher, settings=settings, metrics=metrics, judge=judge, pair_scorer=scorer)
