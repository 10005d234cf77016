"""The cache's tunables, with the defaults that were calibrated and measured (docs/benchmarks.md).

`DEFAULT_THRESHOLD` and `DEFAULT_GUARDS` come from `python -m bench.cache.calibrate`: the highest-recall
setting whose precision on the calibration half of the labelled question pairs is at least 0.90. The policy
(`CacheRule.threshold`) decides per rule; these are what the CLI and tests use when no policy says otherwise.

Tested in `tests/cache/test_errbound.py`, `tests/bench/test_cache_scale.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from tiergate.cache.guards import GUARDS

__all__ = ["DEFAULT_GUARDS", "DEFAULT_THRESHOLD", "CacheSettings"]

DEFAULT_THRESHOLD = 0.94
DEFAULT_GUARDS: tuple[str, ...] = GUARDS  # all five: numbers, negation, keywords, order, opposites


@dataclass(frozen=True, slots=True)
class CacheSettings:
    prefix: str = "tiergate:cache"  # Redis key prefix: several deployments may share one Redis
    # Which Redis layout (cache.redis.store): "auto" = vector sets when the server has them (Redis 8), else the
    # stream layout (Redis 7); "vectorset" = vector sets or a bypassed cache; "stream" = the Redis 7 layout.
    store: str = "auto"
    max_entries: int = 200_000  # across all tenants; the entries closest to expiry are evicted first
    cluster_shards: int = 16  # on a Redis Cluster: hash-tagged shards the entries spread over (see cache.redis.store)
    guards: tuple[str, ...] = DEFAULT_GUARDS
    candidates: int = 4  # nearest neighbours checked per semantic lookup
    max_semantic_chars: int = 4_000  # longer texts: exact matching only (a metric counts them)
    # Longer prompts or answers are not cached at all: an entry's size is bounded, so one tenant's huge requests
    # cannot fill the store (the entry-count bound, `max_entries`, then bounds its bytes too).
    max_stored_chars: int = 64_000
    max_answer_chars: int = 64_000
    redis_timeout_s: float = 0.08  # per Redis round trip on the request path; then bypass
    lookup_timeout_s: float = 0.5  # whole lookup, embedding included; then bypass
    retry_every_s: float = 0.5  # how often a down Redis is probed
    stream_maxlen: int = 100_000  # index-sync events kept in Redis (a replica further behind resyncs)
    # How long the batcher waits for more texts before embedding. Texts that arrive while it is busy are
    # always taken together; waiting longer only pays off for fp32 graphs (int8 graphs run one text per
    # call, as fast as a batch on one thread), so the default does not wait.
    embed_linger_ms: float = 0.0
    embed_max_batch: int = 32
    hnsw_at: int = 20_000  # a namespace with more entries than this gets an HNSW graph (usearch)
    # Redis 8 vector sets: build effort 100 (less insert CPU than Redis's default 200) and search effort 50, chosen
    # by bench/cache/efsweep.py for recall against search time (its figures: docs/benchmarks.md).
    vset_build_ef: int = 100
    vset_search_ef: int = 50
    vset_m: int = 16
    # VSIM inside a script with the candidates' reads: one round trip, on Redis's main thread (cache.redis.vset)
    vset_search_in_script: bool = True
    sweep_every_s: float = 5.0  # expired entries leave the index (in process, or Redis 8's) at least this often
    # Error-bounded hits (cache.errbound), for rules with `max_false_hit_rate`:
    judge_band: float = 0.05  # misses this far (cosine) below the cutoff have their answer judged too
    judge_threshold: float = 0.90  # the embedding judge: answers at least this similar are equivalent
    errbound_sync_s: float = 1.0  # how often each gateway adds its counts to Redis and reads everyone's
    entry_memory_s: float = 30 * 86_400  # how long an entry's own (raised) threshold is kept
    feedback_ttl_s: float = 86_400  # how long after a hit `POST /v1/cache/feedback` can still report it
