"""The cloud pool's Prometheus series (prefix `tiergate_cloud_`), on the registry it is given.

Labelled by tier and endpoint id ("host:port"); `forget` drops an endpoint's series when DNS discovery no
longer lists it, so scaled-down pods do not linger on dashboards. One `CloudMetrics` serves every cloud tier
of a gateway (the series carry the tier); the gateway passes its own registry, as for every package.

Tested in `tests/gateway/pools/test_cloud.py`, `tests/gateway/test_tiers.py`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    from tiergate.gateway.pools.vllm_metrics import Rates, VllmMetrics

__all__ = ["CloudMetrics"]

_EP = ["tier", "endpoint"]


class CloudMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.endpoints = Gauge("tiergate_cloud_endpoints", "Known vLLM endpoints (static plus discovered)", ["tier"],
                               registry=r)
        self.endpoint_healthy = Gauge("tiergate_cloud_endpoint_healthy", "1 when the last health poll passed", _EP,
                                      registry=r)
        self.endpoint_load = Gauge("tiergate_cloud_endpoint_load", "Load used for routing (busy fraction, 0..1+)",
                                   _EP, registry=r)
        self.endpoint_running = Gauge("tiergate_cloud_endpoint_requests_running", "vllm:num_requests_running", _EP,
                                      registry=r)
        self.endpoint_waiting = Gauge("tiergate_cloud_endpoint_requests_waiting", "vllm:num_requests_waiting", _EP,
                                      registry=r)
        self.endpoint_kv_cache_usage = Gauge("tiergate_cloud_endpoint_kv_cache_usage",
                                             "vllm:kv_cache_usage_perc (0..1)", _EP, registry=r)
        self.prefix_cache_hit_rate = Gauge(
            "tiergate_cloud_prefix_cache_hit_rate",
            "Prefix-cache hit tokens / queried tokens over the recent window", _EP, registry=r)
        self.spec_acceptance_rate = Gauge(
            "tiergate_cloud_spec_decode_acceptance_rate",
            "Accepted / proposed speculative tokens over the recent window", _EP, registry=r)
        self.spec_mean_accepted_length = Gauge(
            "tiergate_cloud_spec_decode_mean_accepted_length",
            "Tokens produced per decoding step with speculation (1 + accepted per draft) over the recent window",
            _EP, registry=r)
        self.prefix_memory_keys = Gauge(
            "tiergate_cloud_prefix_memory_keys",
            "Prompt prefixes this gateway believes the server holds in its KV cache (gateway.pools.prefix_memory)",
            _EP, registry=r)
        self.breaker_state = Gauge("tiergate_cloud_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open",
                                   _EP, registry=r)
        self.breaker_opened = Counter("tiergate_cloud_breaker_opened", "Times the circuit breaker opened", _EP,
                                      registry=r)
        self.poll_failures = Counter(
            "tiergate_cloud_poll_failures",
            "Failed health/metrics polls by kind (timeout, unreachable, http_status, not_vllm, wrong_model)",
            [*_EP, "kind"], registry=r)
        self.selections = Counter(
            "tiergate_cloud_selections",
            "Routing choices by strategy and reason (affinity, cached, spill, no_key, round_robin, least_load, probe)",
            ["tier", "strategy", "reason"], registry=r)
        self._per_endpoint = (self.endpoint_healthy, self.endpoint_load, self.endpoint_running,
                              self.endpoint_waiting, self.endpoint_kv_cache_usage, self.prefix_cache_hit_rate,
                              self.spec_acceptance_rate, self.spec_mean_accepted_length, self.breaker_state,
                              self.breaker_opened, self.prefix_memory_keys)

    def record_reading(self, tier: str, endpoint: str, load: float, reading: VllmMetrics, rates: Rates,
                       remembered: int) -> None:
        """One server's poll: its routing load, vLLM's gauges, the rates known over the window, and how many
        prefixes the gateway believes it holds."""
        self.endpoint_load.labels(tier, endpoint).set(load)
        self.prefix_memory_keys.labels(tier, endpoint).set(remembered)
        self.endpoint_running.labels(tier, endpoint).set(reading.running)
        self.endpoint_waiting.labels(tier, endpoint).set(reading.waiting)
        self.endpoint_kv_cache_usage.labels(tier, endpoint).set(reading.kv_cache_usage)
        for gauge, value in ((self.prefix_cache_hit_rate, rates.prefix_cache_hit_rate),
                             (self.spec_acceptance_rate, rates.spec_acceptance_rate),
                             (self.spec_mean_accepted_length, rates.spec_mean_accepted_length)):
            if value is not None:  # unknown over the window (no queries, no drafts): left as it was
                gauge.labels(tier, endpoint).set(value)

    def forget(self, tier: str, endpoint: str) -> None:
        """Remove an endpoint's labelled series (it left the pool)."""
        for metric in self._per_endpoint:
            with contextlib.suppress(KeyError):
                metric.remove(tier, endpoint)
