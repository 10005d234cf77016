"""The cache's tunables, with the defaults that were calibrated and measured (docs/benchmarks.md).

`DEFAULT_THRESHOLD` and `DEFAULT_GUARDS` come from `python -m bench.cache.calibrate`: the highest-recall
setting whose precision on the calibration half of the labelled question pairs is at least 0.90. The policy
(`CacheRule.threshold`) decides per rule; these are what the CLI and tests use when no policy says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from cache.guards import GUARDS

__all__ = ["DEFAULT_GUARDS", "DEFAULT_THRESHOLD", "CacheSettings"]

DEFAULT_THRESHOLD = 0.94
DEFAULT_GUARDS: tuple[str, ...] = GUARDS  # all four: numbers, negation, keywords, order


@dataclass(frozen=True, slots=True)
class CacheSettings:
    prefix: str = "tiergate:cache"  # Redis key prefix: several deployments may share one Redis
    max_entries: int = 200_000  # across all tenants; the entries closest to expiry are evicted first
    cluster_shards: int = 16  # on a Redis Cluster: hash-tagged shards the entries spread over (see redis_store)
    guards: tuple[str, ...] = DEFAULT_GUARDS
    candidates: int = 4  # nearest neighbours checked per semantic lookup
    max_semantic_chars: int = 4_000  # longer texts: exact matching only (a metric counts them)
    max_stored_chars: int = 1_000_000  # longer prompts are not cached at all
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
    sweep_every_s: float = 5.0  # expired entries leave the in-process index at least this often
