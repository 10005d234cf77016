"""The cache's Prometheus metrics (prefix `tiergate_cache_`).

One `CacheMetrics` per registry: the process-wide default is shared by every cache in the process (a
registry refuses duplicate names), and tests pass their own `CollectorRegistry` to read exact values.
"""

from __future__ import annotations

from functools import cache

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["CacheMetrics", "default_metrics"]

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        p = "tiergate_cache_"
        r = registry
        self.lookups = Counter(p + "lookups", "Cache lookups by result", ["result"], registry=r)
        self.skipped = Counter(p + "skipped", "Requests not looked up or not stored, by reason", ["reason"],
                               registry=r)
        self.semantic_skipped = Counter(p + "semantic_skipped", "Lookups limited to exact matching, by reason",
                                        ["reason"], registry=r)
        self.vetoes = Counter(p + "vetoes", "Semantic candidates rejected by a guard", ["guard"], registry=r)
        self.stores = Counter(p + "stores", "Answers offered to the cache, by result", ["result"], registry=r)
        self.evictions = Counter(p + "evictions", "Entries evicted by the size bound", registry=r)
        self.invalidations = Counter(p + "invalidated_entries", "Entries removed by invalidation", ["scope"],
                                     registry=r)
        self.errors = Counter(p + "errors", "Cache failures (each became a bypass or a skipped store)", ["op"],
                              registry=r)
        self.resyncs = Counter(p + "index_resyncs", "Full reloads of the in-process index from Redis", registry=r)
        self.embedding_seconds = Histogram(p + "embedding_seconds", "Time to embed one batch of texts",
                                           buckets=_LATENCY_BUCKETS, registry=r)
        self.embedding_batch = Histogram(p + "embedding_batch_size", "Texts embedded together",
                                         buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.lookup_seconds = Histogram(p + "lookup_seconds", "Whole lookup time, embedding included",
                                        ["result"], buckets=_LATENCY_BUCKETS, registry=r)
        self.verifier_seconds = Histogram(p + "verifier_seconds", "Time the cross-encoder verifier took to score "
                                          "one semantic candidate of an error-bounded rule",
                                          buckets=_LATENCY_BUCKETS, registry=r)
        self.entries = Gauge(p + "entries", "Entries in this process's index (redis-vectorset: in Redis)", registry=r)
        self.redis_up = Gauge(p + "redis_up", "1 when the cache's Redis answered its last command", registry=r)
        self.store_kind = Gauge(p + "store", "1 for the Redis layout serving (redis-vectorset, redis-stream)",
                                ["store"], registry=r)
        # Error-bounded hits (cache.errbound).
        self.verifications = Counter(p + "verifications", "Labels for semantic candidates: source verify (a "
                                     "sampled would-be hit sent to the tier), judge (a near miss), feedback "
                                     "(reported by a client); result right or wrong", ["tenant", "source", "result"],
                                     registry=r)
        self.cutoff = Gauge(p + "semantic_cutoff", "Certified cutoff per tenant, false-hit bound and word overlap "
                            "region (its lower edge; +Inf: not enough evidence yet, no semantic hits): a cosine, or "
                            "with a verifier a bound score (tenant <name>@v<verifier digest>)",
                            ["tenant", "bound", "overlap"], registry=r)
        self.false_hit_rate = Gauge(p + "false_hit_rate", "Estimated false-hit rate of the semantic hits served "
                                    "at the cutoff (point and 95% upper bound)", ["tenant", "bound", "estimate"],
                                    registry=r)
        self.semantic_threshold = Histogram(p + "semantic_threshold", "Threshold a bounded semantic candidate had "
                                            "to reach (the cutoff, or its entry's own)",
                                            buckets=(0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99, 1.0),
                                            registry=r)
        self.feedback = Counter(p + "feedback", "POST /v1/cache/feedback calls by result", ["result"], registry=r)
        self._by_result: dict[str, tuple[Counter, Histogram]] = {}

    def looked_up(self, result: str, seconds: float) -> None:
        """Count one lookup and its time. Runs on every request, so the labelled series are remembered
        (`labels()` validates and locks on each call); results come from the small CacheStatus set."""
        series = self._by_result.get(result)
        if series is None:
            series = self._by_result[result] = (self.lookups.labels(result), self.lookup_seconds.labels(result))
        series[0].inc()
        series[1].observe(seconds)


@cache
def default_metrics() -> CacheMetrics:
    """The metrics on the default registry, created once per process on first use."""
    return CacheMetrics(REGISTRY)
