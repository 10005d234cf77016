"""The gateway's Prometheus metrics (names prefixed `tiergate_`), on the registry the gateway was given.

Every package registers its metrics the same way: a class whose constructor takes a `CollectorRegistry`
(`cache.metrics.CacheMetrics`, `policies.store.PolicyMetrics`, `gateway.pools.metrics.CloudMetrics`,
`edge_node.server.metrics.EdgeMetrics`, this `GatewayMetrics`). A gateway makes one registry, hands it to all of
them and serves it on /metrics, so two gateways in one process (tests, benchmarks) never share a series.

`exposition` is what /metrics serves: the registry as Prometheus text, with or without tenant labels
(`TIERGATE_METRICS_TENANT_LABELS`).

The series are tested in `tests/gateway/test_dispatch.py`, `tests/gateway/test_limits.py`,
`tests/gateway/test_shadow.py` and others; `exposition` in `tests/gateway/test_metrics.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

__all__ = ["TENANT_LABEL", "GatewayMetrics", "exposition"]

TENANT_LABEL = "tenant"

_M = TypeVar("_M", bound=MetricWrapperBase)

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_OVERHEAD = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)


class GatewayMetrics:
    """The series the request path, dispatch and the tenant limits update."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.requests = Counter("tiergate_requests_total",
                                "Requests answered, by endpoint, tier, rule, cache result and status.",
                                ["endpoint", "tier", "rule", "cache", "status"], registry=r)
        self.duration = Histogram("tiergate_request_duration_seconds", "Time from request to last byte, by tier.",
                                  ["tier"], buckets=_LATENCY, registry=r)
        self.ttft = Histogram("tiergate_time_to_first_token_seconds", "Time to the first streamed token, by tier.",
                              ["tier"], buckets=_LATENCY, registry=r)
        self.overhead = Histogram("tiergate_overhead_seconds",
                                  "Time spent in the gateway itself (not waiting on a backend).", buckets=_OVERHEAD,
                                  registry=r)
        self.tokens = Counter("tiergate_tokens_total", "Tokens processed, by tier and kind (prompt, completion).",
                              ["tier", "kind"], registry=r)
        self.decisions = Counter("tiergate_routing_decisions_total", "Policy decisions, by rule and target tier.",
                                 ["rule", "tier"], registry=r)
        self.fallbacks = Counter("tiergate_fallbacks_total",
                                 "Requests that moved to another tier, by from, to and reason.",
                                 ["from_tier", "to_tier", "reason"], registry=r)
        self.upstream_errors = Counter("tiergate_upstream_errors_total", "Failed backend attempts, by tier and kind.",
                                       ["tier", "kind"], registry=r)
        self.stream_errors = Counter("tiergate_stream_errors_total",
                                     "Streams ended by an SSE error event after they began.", ["tier"], registry=r)
        self.shadow_checks = Counter("tiergate_cache_shadow_checks_total",
                                     "Cache hits checked against a tier after they were served (verify_mode: shadow), "
                                     "by result: checked, dropped (no room), failed (no usable answer).", ["result"],
                                     registry=r)
        self.shed = Counter("tiergate_shed_total",
                            "Requests refused because a tier stayed saturated, by tier and priority.",
                            ["tier", "priority"], registry=r)
        self.client_errors = Counter("tiergate_client_errors_total",
                                     "Requests answered with an OpenAI-format error (4xx and 5xx), by error code.",
                                     ["code"], registry=r)
        self.inflight = Gauge("tiergate_inflight_requests", "Requests in flight through this gateway, by tier.",
                              ["tier"], registry=r)
        self.queued = Gauge("tiergate_queued_requests", "Requests waiting for a saturated tier, by tier.", ["tier"],
                            registry=r)
        self.disconnects = Counter("tiergate_client_disconnects_total",
                                   "Clients that went away before their answer ended.", ["tier"], registry=r)
        self.rate_limited = Counter("tiergate_rate_limited_total",
                                    "Requests refused by a tenant limit, by tenant and limit.", ["tenant", "limit"],
                                    registry=r)
        self.fail_open = Counter("tiergate_rate_limit_fail_open_total",
                                 "Limit checks skipped because Redis did not answer.", registry=r)
        self.cascade = Counter("tiergate_cascade_total",
                               "Cascade decisions, by rule, outcome (kept, escalated) and reason.",
                               ["rule", "outcome", "reason"], registry=r)
        self.cascade_decision = Histogram("tiergate_cascade_decision_seconds",
                                          "Time from dispatch to the cascade's decision, by rule and outcome.",
                                          ["rule", "outcome"], buckets=_LATENCY, registry=r)
        self.cascade_edge_tokens = Counter("tiergate_cascade_escalated_edge_tokens_total",
                                           "Tokens the first tier processed for answers that were escalated.",
                                           ["rule"], registry=r)
        self.cascade_edge_seconds = Counter("tiergate_cascade_escalated_edge_seconds_total",
                                            "Time spent on the first tier by requests that were escalated.",
                                            ["rule"], registry=r)
        self.poison = Counter("tiergate_poison_requests_total",
                              "Requests that broke a backend before their answer began, by outcome: retried (on one "
                              "other backend), quarantined (broke a second), refused (already quarantined).",
                              ["outcome"], registry=r)
        self.spend = Counter("tiergate_spend_total",
                             "What requests cost, in the policy's currency (costs.currency), by tenant, the tier that "
                             "did the work, rule and kind: answer (an answer's own tokens; a cache hit's are 0), "
                             "escalated (a cascade's thrown-away first attempt), gone (a client that left before its "
                             "answer: its prompt), shadow (a cache hit's shadow check).",
                             [TENANT_LABEL, "tier", "rule", "kind", "currency"], registry=r)
        self.spend_reference = Counter("tiergate_spend_reference_total",
                                       "What the same answers would have cost on the policy's reference tier "
                                       "(costs.reference_tier), by tenant, the tier that answered (cache for a hit) "
                                       "and rule: the saving is this minus tiergate_spend_total.",
                                       [TENANT_LABEL, "tier", "rule", "currency"], registry=r)
        self.budget_refused = Counter("tiergate_budget_refused_total",
                                      "Requests a hard budget refused (or downgraded), by tenant, scope (tenant, key) "
                                      "and action (refused, downgraded).", [TENANT_LABEL, "scope", "action"],
                                      registry=r)
        self.budget_alerts = Counter("tiergate_budget_alerts_total",
                                     "Budgets whose spend crossed a limit, by tenant, scope (tenant, key) and level "
                                     "(soft, hard): each crossing counts once per replica that saw it.",
                                     [TENANT_LABEL, "scope", "level"], registry=r)
        self.budget_unchecked = Counter("tiergate_budget_unchecked_total",
                                        "Requests admitted without their budget checked (the ledger unreachable, "
                                        "on_redis_down: allow), by tenant.", [TENANT_LABEL], registry=r)
        self.ledger_errors = Counter("tiergate_spend_ledger_errors_total",
                                     "Spend ledger operations that failed (Redis unreachable), by operation "
                                     "(reserve, settle, read).", ["op"], registry=r)
        self.savings_spend = Counter("tiergate_savings_spend_total",
                                     "tiergate_spend_total by what it was spent for (gateway.savings): edge, cache "
                                     "(its shadow checks), cascade (kept answers and thrown-away attempts), cloud.",
                                     ["source", "currency"], registry=r)
        self.savings_reference = Counter("tiergate_savings_reference_total",
                                         "tiergate_spend_reference_total by source: the saving of a source is this "
                                         "minus tiergate_savings_spend_total.", ["source", "currency"], registry=r)
        self.distill = Counter("tiergate_distill_records_total",
                               "Distillation records, by result (recorded, failed).", ["result"], registry=r)
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], MetricWrapperBase] = {}

    def child(self, metric: _M, *values: str) -> _M:
        """`metric.labels(*values)`, remembered: the request path labels the same few series on every request,
        and `labels()` validates and takes a lock each time. Label values here come from bounded sets (tiers,
        rules, statuses), and the memo stops growing at 10,000 series anyway."""
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            found = metric.labels(*values)
            if len(self._children) < 10_000:
                self._children[key] = found
        return found  # type: ignore[return-value]


def exposition(registry: CollectorRegistry, *, tenant_labels: bool = True) -> bytes:
    """The registry in the Prometheus text format, as /metrics serves it.

    `tenant_labels=False` leaves every `tenant` label out, so that the page names no tenant: the samples of a
    counter, histogram or summary that differ only by tenant are summed into one (their `_created` time is the
    earliest), and gauges labelled by tenant (per-tenant values, such as the cache's certified cutoffs, that do
    not add up) are left out."""
    return generate_latest(registry if tenant_labels else _WithoutTenants(registry))


class _WithoutTenants(Collector):
    """A registry's metric families with the tenant label taken out (`exposition`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            if any(TENANT_LABEL in s.labels for s in family.samples):
                yield _without_tenants(family)
            else:
                yield family


def _without_tenants(family: Metric) -> Metric:
    out = Metric(family.name, family.documentation, family.type, family.unit)
    if family.type in ("gauge", "info", "stateset"):  # values per tenant: they do not add up
        out.samples = [s for s in family.samples if TENANT_LABEL not in s.labels]
        return out
    merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name, labels, value in _untenanted(family.samples):
        key = (name, labels)
        if key not in merged:
            merged[key] = value
        elif name.endswith("_created"):
            merged[key] = min(merged[key], value)
        else:
            merged[key] += value
    out.samples = [Sample(name, dict(labels), value) for (name, labels), value in merged.items()]
    return out


def _untenanted(samples: Iterable[Sample]) -> Iterator[tuple[str, tuple[tuple[str, str], ...], float]]:
    for s in samples:
        yield s.name, tuple((k, v) for k, v in s.labels.items() if k != TENANT_LABEL), s.value
