"""The cloud pool's Prometheus series (prefix `tiergate_cloud_`), registered once per process.

Labelled by tier and endpoint id ("host:port"); `forget` drops an endpoint's series when DNS
discovery no longer lists it, so scaled-down pods do not linger on dashboards.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = [
    "BREAKER_OPENED",
    "BREAKER_STATE",
    "ENDPOINTS",
    "ENDPOINT_HEALTHY",
    "ENDPOINT_KV_CACHE_USAGE",
    "ENDPOINT_LOAD",
    "ENDPOINT_RUNNING",
    "ENDPOINT_WAITING",
    "POLL_FAILURES",
    "PREFIX_CACHE_HIT_RATE",
    "SELECTIONS",
    "SPEC_ACCEPTANCE_RATE",
    "SPEC_MEAN_ACCEPTED_LENGTH",
    "forget",
]

_EP = ["tier", "endpoint"]

ENDPOINTS = Gauge("tiergate_cloud_endpoints", "Known vLLM endpoints (static plus discovered)", ["tier"])
ENDPOINT_HEALTHY = Gauge("tiergate_cloud_endpoint_healthy", "1 when the last health poll passed", _EP)
ENDPOINT_LOAD = Gauge("tiergate_cloud_endpoint_load", "Load used for routing (busy fraction, 0..1+)", _EP)
ENDPOINT_RUNNING = Gauge("tiergate_cloud_endpoint_requests_running", "vllm:num_requests_running", _EP)
ENDPOINT_WAITING = Gauge("tiergate_cloud_endpoint_requests_waiting", "vllm:num_requests_waiting", _EP)
ENDPOINT_KV_CACHE_USAGE = Gauge("tiergate_cloud_endpoint_kv_cache_usage", "vllm:kv_cache_usage_perc (0..1)", _EP)
PREFIX_CACHE_HIT_RATE = Gauge(
    "tiergate_cloud_prefix_cache_hit_rate", "Prefix-cache hit tokens / queried tokens over the recent window", _EP
)
SPEC_ACCEPTANCE_RATE = Gauge(
    "tiergate_cloud_spec_decode_acceptance_rate",
    "Accepted / proposed speculative tokens over the recent window",
    _EP,
)
SPEC_MEAN_ACCEPTED_LENGTH = Gauge(
    "tiergate_cloud_spec_decode_mean_accepted_length",
    "Tokens produced per decoding step with speculation (1 + accepted per draft) over the recent window",
    _EP,
)
BREAKER_STATE = Gauge("tiergate_cloud_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open", _EP)
BREAKER_OPENED = Counter("tiergate_cloud_breaker_opened", "Times the circuit breaker opened", _EP)
POLL_FAILURES = Counter(
    "tiergate_cloud_poll_failures",
    "Failed health/metrics polls by kind (timeout, unreachable, http_status, not_vllm, wrong_model)",
    [*_EP, "kind"],
)
SELECTIONS = Counter(
    "tiergate_cloud_selections",
    "Routing choices by strategy and reason (affinity, spill, no_key, round_robin, least_load, probe)",
    ["tier", "strategy", "reason"],
)

_PER_ENDPOINT = (
    ENDPOINT_HEALTHY,
    ENDPOINT_LOAD,
    ENDPOINT_RUNNING,
    ENDPOINT_WAITING,
    ENDPOINT_KV_CACHE_USAGE,
    PREFIX_CACHE_HIT_RATE,
    SPEC_ACCEPTANCE_RATE,
    SPEC_MEAN_ACCEPTED_LENGTH,
    BREAKER_STATE,
    BREAKER_OPENED,
)


def forget(tier: str, endpoint: str) -> None:
    """Remove an endpoint's labelled series (it left the pool)."""
    for metric in _PER_ENDPOINT:
        try:
            metric.remove(tier, endpoint)
        except KeyError:
            pass
