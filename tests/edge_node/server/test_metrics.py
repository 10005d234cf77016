"""An edge node's metrics: their own registry per node, and gauges that read the engine when scraped."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.support.edge import parse_metrics
from tiergate.edge_node.server.metrics import EdgeMetrics


def scraped(m: EdgeMetrics) -> dict[str, float]:
    return {name: v for (name, labels), v in parse_metrics(m.render().decode()).items() if not labels}


def test_two_nodes_in_one_process_keep_separate_counts() -> None:
    a, b = EdgeMetrics(), EdgeMetrics()
    a.generation_tokens.inc(5)
    a.requests.labels("chat", "stop").inc()
    assert scraped(a)["tiergate_edge_generation_tokens_total"] == 5
    assert scraped(b)["tiergate_edge_generation_tokens_total"] == 0
    assert parse_metrics(a.render().decode())[
        ("tiergate_edge_requests_total", (("endpoint", "chat"), ("finish_reason", "stop")))] == 1


def test_a_given_registry_is_used() -> None:
    registry = CollectorRegistry()
    m = EdgeMetrics(registry)
    m.decode_calls.inc()
    assert m.registry is registry
    assert registry.get_sample_value("tiergate_edge_decode_calls_total") == 1


def test_engine_gauges_are_read_at_scrape_time() -> None:
    m = EdgeMetrics()
    state = {"slots": 4.0, "busy": 1.0, "queued": 0.0, "used": 256.0, "total": 1024.0, "tps": 12.5}
    reads = {"n": 0}

    def busy() -> float:
        reads["n"] += 1
        return state["busy"]

    m.bind_engine(lambda: state["slots"], busy, lambda: state["queued"], lambda: state["used"],
                  lambda: state["total"], lambda: state["tps"])
    assert reads["n"] == 0  # binding reads nothing
    first = scraped(m)
    assert (first["tiergate_edge_slots"], first["tiergate_edge_busy_slots"], first["tiergate_edge_queued_requests"]) \
        == (4, 1, 0)
    assert first["tiergate_edge_kv_usage_ratio"] == 0.25 and first["tiergate_edge_tokens_per_second"] == 12.5
    state.update(busy=4.0, queued=3.0, used=1024.0)
    second = scraped(m)
    assert (second["tiergate_edge_busy_slots"], second["tiergate_edge_queued_requests"]) == (4, 3)
    assert second["tiergate_edge_kv_cells_used"] == 1024 and second["tiergate_edge_kv_usage_ratio"] == 1.0
    assert reads["n"] == 2


def test_an_empty_kv_cache_reads_as_zero_usage_not_an_error() -> None:
    m = EdgeMetrics()
    m.bind_engine(lambda: 1.0, lambda: 0.0, lambda: 0.0, lambda: 0.0, lambda: 0.0, lambda: 0.0)
    assert scraped(m)["tiergate_edge_kv_usage_ratio"] == 0.0


def test_batch_histograms_show_continuous_batching_above_one_sequence() -> None:
    m = EdgeMetrics()
    for n in (1, 1, 3, 4):
        m.batch_sequences.observe(n)
    samples = parse_metrics(m.render().decode())
    assert samples[("tiergate_edge_batch_sequences_bucket", (("le", "1.0"),))] == 2
    assert samples[("tiergate_edge_batch_sequences_count", ())] == 4
    names = {name for name, _ in samples}
    assert all(n.startswith("tiergate_edge_") for n in names)
