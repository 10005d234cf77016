"""What tiergate's routing saved against all-cloud, split by what saved it: the edge, the cache, the cascade.

Every priced piece of work (`gateway.settlement`) counts its cost, and an answer what it would have cost on the
reference tier, towards one source (`tiergate_savings_spend_total` and `tiergate_savings_reference_total`, by
source): the saving of a source is the one less the other, and the sources add up to
`tiergate_spend_reference_total` minus `tiergate_spend_total`. Work that was not the answer (a cascade's thrown-away first attempt, a shadow check, a
client gone mid-way) saves nothing and costs what it cost: it counts against the source that caused it.

- `cascade`: everything a cascade rule's requests did: the answers it kept on the first tier, less the first
  attempts it threw away (an escalated answer from the reference tier saves nothing by itself).
- `cache`: hits (the whole reference price), less the shadow checks that verify them.
- `edge`: answers from edge tiers under other rules.
- `cloud`: answers from cloud tiers other than the reference (cheaper or dearer than it).
- `embeddings`: `/v1/embeddings` (`gateway.embeddings`), the same work whatever the routing: its reference is its
  own price, so it saves nothing, and is counted so that the sources still add up.

Savings are never shown alone: the status page and the dashboard put them beside what they cost in quality
(cascade escalations, shadow-check disagreements, cache feedback; `gateway.history`).

Tested in `tests/gateway/test_settlement.py` (the split of each ending) and `tests/gateway/test_history.py`.
"""

from __future__ import annotations

from enum import StrEnum

from tiergate.gateway.context import RequestContext
from tiergate.gateway.metrics import GatewayMetrics

__all__ = ["SavingSource", "count_saving", "record_saving", "saving_source"]


class SavingSource(StrEnum):
    EDGE = "edge"
    CACHE = "cache"
    CASCADE = "cascade"
    CLOUD = "cloud"
    EMBEDDINGS = "embeddings"


def saving_source(ctx: RequestContext, tier: str, kind: str) -> SavingSource:
    """What a piece of a request's work counts towards (see the module's docstring)."""
    if tier == "cache" or kind == "shadow":
        return SavingSource.CACHE
    if ctx.decision.cascade is not None:
        return SavingSource.CASCADE
    config = ctx.policy.tiers.get(tier)
    return SavingSource.EDGE if config is not None and config.kind == "edge" else SavingSource.CLOUD


def record_saving(metrics: GatewayMetrics, ctx: RequestContext, tier: str, kind: str, cost: float,
                  reference: float | None, currency: str) -> None:
    """Count a piece of work's cost (and, for an answer, its `reference` price) towards its source: the saving
    is `tiergate_savings_reference_total - tiergate_savings_spend_total`, by source (two counters, because a
    saving can be negative and a counter cannot)."""
    count_saving(metrics, saving_source(ctx, tier, kind), cost, reference, currency)


def count_saving(metrics: GatewayMetrics, source: SavingSource, cost: float, reference: float | None,
                 currency: str) -> None:
    """Count `cost` (and `reference`, if any) towards `source`: `record_saving` once the source is known."""
    metrics.child(metrics.savings_spend, source.value, currency).inc(cost)
    if reference is not None:
        metrics.child(metrics.savings_reference, source.value, currency).inc(reference)
