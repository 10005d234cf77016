"""The cache's Prometheus metrics: one set per registry, exact values readable from a test's own registry."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from tests.cache.helpers import fresh_metrics, sample
from tiergate.cache.metrics import CacheMetrics, default_metrics


def test_a_lookup_counts_once_and_observes_its_time_under_its_result() -> None:
    metrics, registry = fresh_metrics()
    metrics.looked_up("hit-exact", 0.003)
    metrics.looked_up("hit-exact", 0.0004)
    metrics.looked_up("miss", 0.2)
    assert sample(registry, "tiergate_cache_lookups_total", result="hit-exact") == 2
    assert sample(registry, "tiergate_cache_lookups_total", result="miss") == 1
    assert sample(registry, "tiergate_cache_lookup_seconds_count", result="hit-exact") == 2
    assert sample(registry, "tiergate_cache_lookup_seconds_sum", result="hit-exact") == pytest.approx(0.0034)
    # the buckets are the cache's latency buckets: 0.4 ms is under 0.5 ms, 3 ms is not under 2 ms
    assert sample(registry, "tiergate_cache_lookup_seconds_bucket", result="hit-exact", le="0.0005") == 1
    assert sample(registry, "tiergate_cache_lookup_seconds_bucket", result="hit-exact", le="0.002") == 1
    assert sample(registry, "tiergate_cache_lookup_seconds_bucket", result="hit-exact", le="0.005") == 2
    assert sample(registry, "tiergate_cache_lookup_seconds_bucket", result="miss", le="0.1") == 0


def test_every_series_is_prefixed_and_stays_in_its_own_registry() -> None:
    metrics, registry = fresh_metrics()
    metrics.errors.labels("decode").inc()
    metrics.redis_up.set(1)
    text = generate_latest(registry).decode()
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert names and all(n.startswith("tiergate_cache_") for n in names)
    assert {"tiergate_cache_errors_total", "tiergate_cache_redis_up", "tiergate_cache_semantic_cutoff",
            "tiergate_cache_feedback_total"} <= names
    other = CollectorRegistry()
    CacheMetrics(other)  # a second registry holds its own, untouched series
    assert sample(other, "tiergate_cache_errors_total", op="decode") == 0
    assert sample(registry, "tiergate_cache_errors_total", op="decode") == 1


def test_a_registry_refuses_a_second_set() -> None:
    _, registry = fresh_metrics()
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        CacheMetrics(registry)


def test_the_default_set_is_created_once_on_the_default_registry() -> None:
    first = default_metrics()
    assert default_metrics() is first
    before = REGISTRY.get_sample_value("tiergate_cache_evictions_total") or 0.0
    first.evictions.inc(3)
    assert REGISTRY.get_sample_value("tiergate_cache_evictions_total") == before + 3
