"""What a policy would do with a day of traffic (`tiergate policy simulate`): per request, and totals.

Totals are what an operator sizes tiers and thresholds by: the share per tier and per tier kind, rejects,
which rules fired, how much the cache could answer, what it costs and saves against the reference tier
(`policies.cost_sim`) and, when traffic lines carry a `source` (a name for the
kind of traffic: "support-chat", "batch-eval", ...), the cloud share of each source, since a threshold that
sends 30 % of the mix to the cloud may send 60 % of one kind of traffic.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from tiergate.core.types import Decision, Features
from tiergate.policies.cascade_sim import CascadeTally
from tiergate.policies.cost_sim import ASSUMED_COMPLETION, CostTally
from tiergate.policies.model import Policy

__all__ = ["UNLABELLED", "Simulation"]

UNLABELLED = "(no source)"


class Simulation:
    """Accumulates decisions; `row` describes one request, `totals` all of them."""

    def __init__(self, policy: Policy, assumed_completion: int = ASSUMED_COMPLETION,
                 router: tuple[str | None, bool] | None = None) -> None:
        self._policy = policy
        self.costs = CostTally(policy, assumed_completion)
        # the learned router: (edge version, whether it has a model); None without a `router` section
        self._router = router
        self._edge_rules = frozenset(r.name for r in policy.rules if r.when.edge_success is not None)
        self.predicted = self.by_router = 0
        self.tiers: Counter[str] = Counter()
        self.rules: Counter[str] = Counter()
        self.rejects: Counter[int] = Counter()
        self.kinds: Counter[str] = Counter()
        self.by_source: defaultdict[str, Counter[str]] = defaultdict(Counter)  # source -> kind or "reject" -> n
        self.labelled = False
        self.errors = self.decided = self.eligible = self.semantic = self.repeats = 0
        self._seen: set[tuple[str, str, str]] = set()
        self.cascades = CascadeTally()

    def error(self) -> None:
        self.errors += 1

    def row(self, f: Features, d: Decision, source: str | None = None,
            cascade: dict[str, Any] | None = None, line: dict[str, Any] | None = None) -> dict[str, Any]:
        """Record one decided request and describe it (tier, rule, complexity, cache use, cost ...); `cascade` is
        the confidence the traffic log recorded for it, if any (what a cascade rule would have kept); `line` the
        traffic line (its `completion_tokens`, `max_tokens` price it)."""
        out = self._row(f, d, source, cascade)
        priced = self.costs.add(f, d, out["cache"], out.get("cascade"), line or {}, cascade)
        if priced is not None:
            out.update(priced)
        return out

    def _row(self, f: Features, d: Decision, source: str | None,
             cascade: dict[str, Any] | None) -> dict[str, Any]:
        self.decided += 1
        self.rules[d.rule] += 1
        out: dict[str, Any] = {"tier": d.tier, "rule": d.rule, "fallbacks": list(d.fallbacks),
                               "complexity": round(f.complexity, 4), "prompt_tokens": f.prompt_tokens,
                               "priority": f.priority.name.lower()}
        if source is not None:
            self.labelled = True
            out["source"] = source
        if f.edge_success is not None:
            self.predicted += 1
            out["edge_success"] = round(f.edge_success, 4)
        if d.rule in self._edge_rules:
            self.by_router += 1
        if d.cascade is not None:
            out["cascade"] = self.cascades.add(d, cascade)
        if d.reject is not None:
            self.rejects[d.reject.status] += 1
            self.by_source[source or UNLABELLED]["reject"] += 1
            out["reject"] = d.reject.status
            out["cache"] = "none"
            return out
        assert d.tier is not None  # a decision that does not reject names its tier
        tier = self._policy.tiers[d.tier]
        self.tiers[d.tier] += 1
        self.kinds[tier.kind] += 1
        self.by_source[source or UNLABELLED][tier.kind] += 1
        if not d.cache.enabled:
            out["cache"] = "off"
        elif f.temperature is not None and f.temperature > d.cache.max_temperature:
            out["cache"] = "too hot"
        else:
            self.eligible += 1
            self.semantic += d.cache.semantic
            key = (f.tenant, tier.model, f.text)
            if key in self._seen:
                self.repeats += 1
                out["cache"] = "repeat"
            else:
                self._seen.add(key)
                out["cache"] = "eligible"
        return out

    def totals(self) -> dict[str, Any]:
        n = self.decided

        def share(c: int, of: int = n) -> float:
            return round(c / of, 4) if of else 0.0

        out: dict[str, Any] = {
            "requests": n + self.errors, "decided": n, "errors": self.errors,
            "tiers": {t: {"count": c, "share": share(c)} for t, c in sorted(self.tiers.items())},
            "kinds": {k: {"count": c, "share": share(c)} for k, c in sorted(self.kinds.items())},
            "rejected": {"count": sum(self.rejects.values()), "share": share(sum(self.rejects.values())),
                         "by_status": {str(s): c for s, c in sorted(self.rejects.items())}},
            "rules": dict(self.rules.most_common()),
            "cache": {"eligible": self.eligible, "eligible_share": share(self.eligible),
                      "semantic_lookups": self.semantic, "exact_repeats": self.repeats,
                      "exact_repeat_share": share(self.repeats),
                      "note": "exact_repeats are requests a warm cache answers for sure (TTL permitting); "
                              "semantic hits come on top"},
            "cascade": self.cascades.totals(n),
        }
        if self._router is not None:
            version, has_model = self._router
            out["router"] = {"edge_version": version, "model": has_model, "predicted": self.predicted,
                             "decided_by_edge_success_rules": self.by_router,
                             "share_decided_by_edge_success_rules": share(self.by_router),
                             "note": None if has_model else "cold start: no model for this edge version, so no "
                                                            "edge_success condition holds"}
        if (cost := self.costs.totals(n)) is not None:
            out["cost"] = cost
        if self.labelled:
            out["sources"] = {s: {"decided": sum(c.values()), "cloud_share": share(c["cloud"], sum(c.values())),
                                  "edge_share": share(c["edge"], sum(c.values())),
                                  "rejected_share": share(c["reject"], sum(c.values()))}
                              for s, c in sorted(self.by_source.items())}
        return out
