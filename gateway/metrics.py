"""The gateway's Prometheus metrics (names prefixed `tiergate_`).

Metric objects are defined once per process, as Prometheus client libraries intend; the other
packages define theirs in their own modules and everything is served from the default registry.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

_M = TypeVar("_M", bound=MetricWrapperBase)
_CHILDREN: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}


def child(metric: _M, *values: str) -> _M:
    """`metric.labels(*values)`, remembered: the request path labels the same few series on every request,
    and `labels()` validates and takes a lock each time. Label values here come from bounded sets (tiers,
    rules, statuses), and the memo stops growing at 10,000 series anyway."""
    key = (metric, values)
    found = _CHILDREN.get(key)
    if found is None:
        found = metric.labels(*values)
        if len(_CHILDREN) < 10_000:
            _CHILDREN[key] = found
    return found  # type: ignore[return-value]


_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)

REQUESTS = Counter("tiergate_requests_total", "Requests answered, by endpoint, tier, rule, cache result and status.",
                   ["endpoint", "tier", "rule", "cache", "status"])
DURATION = Histogram("tiergate_request_duration_seconds", "Time from request to last byte, by tier.", ["tier"],
                     buckets=_LATENCY)
TTFT = Histogram("tiergate_time_to_first_token_seconds", "Time to the first streamed token, by tier.", ["tier"],
                 buckets=_LATENCY)
OVERHEAD = Histogram("tiergate_overhead_seconds", "Time spent in the gateway itself (not waiting on a backend).",
                     buckets=_OVERHEAD)
TOKENS = Counter("tiergate_tokens_total", "Tokens processed, by tier and kind (prompt, completion).", ["tier", "kind"])
DECISIONS = Counter("tiergate_routing_decisions_total", "Policy decisions, by rule and target tier.", ["rule", "tier"])
FALLBACKS = Counter("tiergate_fallbacks_total", "Requests that moved to another tier, by from, to and reason.",
                    ["from_tier", "to_tier", "reason"])
UPSTREAM_ERRORS = Counter("tiergate_upstream_errors_total", "Failed backend attempts, by tier and kind.",
                          ["tier", "kind"])
STREAM_ERRORS = Counter("tiergate_stream_errors_total", "Streams ended by an SSE error event after they began.",
                        ["tier"])
SHED = Counter("tiergate_shed_total", "Requests refused because a tier stayed saturated, by tier and priority.",
               ["tier", "priority"])
CLIENT_ERRORS = Counter("tiergate_client_errors_total", "Requests answered with an OpenAI-format error (4xx and 5xx), by error code.", ["code"])
INFLIGHT = Gauge("tiergate_inflight_requests", "Requests in flight through this gateway, by tier.", ["tier"])
QUEUED = Gauge("tiergate_queued_requests", "Requests waiting for a saturated tier, by tier.", ["tier"])
DISCONNECTS = Counter("tiergate_client_disconnects_total", "Clients that went away before their answer ended.",
                      ["tier"])
