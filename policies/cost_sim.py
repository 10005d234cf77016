"""`policy simulate` by cost: what a policy's decisions on a traffic file cost, and what they saved against sending
every request to the reference tier, split the way the gateway splits it (`gateway.savings`): edge, cache,
cascade, cloud.

A traffic line rarely says how long its answer was: `completion_tokens` on the line is used when given (a log of
real traffic has it), else the request's `max_tokens` under the decision's cap, else `assumed_completion` (the
totals say how many lines were priced on an assumption). An exact repeat a warm cache answers costs nothing and
saves the reference price (semantic hits come on top and are not counted). A cascade rule with a recorded
confidence pays its first tier and, when it escalates, also its escalation tier; one without a recorded
confidence is priced as kept (and counted as unknown). Figures are estimates of a policy's routing, in its own
`costs` (a policy without them prices nothing).

Tested in `tests/policies/test_simulate.py`.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tiergate.core.types import Decision, Features
from tiergate.policies.model import Policy

__all__ = ["CostTally"]

ASSUMED_COMPLETION = 256


class CostTally:
    """Spend and reference per source and per tier, over the requests `add` is given."""

    def __init__(self, policy: Policy, assumed_completion: int = ASSUMED_COMPLETION) -> None:
        self._policy = policy
        self._assumed = assumed_completion
        self.spend: defaultdict[str, float] = defaultdict(float)  # source -> spend
        self.reference: defaultdict[str, float] = defaultdict(float)  # source -> the same answers on the reference
        self.by_tier: defaultdict[str, float] = defaultdict(float)  # tier -> spend
        self.assumed = 0

    def completion_tokens(self, line: dict[str, Any], decision: Decision) -> int:
        given = line.get("completion_tokens")
        if isinstance(given, int) and not isinstance(given, bool) and given >= 0:
            return given
        asked = line.get("max_tokens")
        asked = asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 else None
        cap = decision.max_tokens_cap
        self.assumed += 1
        if asked is not None:
            return min(asked, cap) if cap else asked
        return min(self._assumed, cap) if cap else self._assumed

    def add(self, f: Features, d: Decision, cache: str, cascade: str | None, line: dict[str, Any],
            recorded: Any) -> dict[str, float] | None:
        """Price one decided request; its {"cost", "reference"} (None without `costs`, or for a reject)."""
        costs = self._policy.costs
        if costs is None or d.reject is not None or d.tier is None:
            return None
        completion = self.completion_tokens(line, d)
        prompt = f.prompt_tokens
        reference = costs.reference(prompt, completion)
        if cache == "repeat":
            source, cost = "cache", 0.0
            self.by_tier["cache"] += 0.0
        elif d.cascade is not None:
            source, cost = "cascade", costs.cost(d.tier, prompt, completion)
            self.by_tier[d.tier] += cost
            if cascade is not None and cascade.startswith("escalated"):
                edge_tokens = recorded.get("tokens") if isinstance(recorded, dict) else None
                thrown = costs.cost(d.tier, prompt, int(edge_tokens) if isinstance(edge_tokens, (int, float))
                                    else completion)
                answer = costs.cost(d.cascade.escalate_to, prompt, completion)
                self.by_tier[d.tier] += thrown - cost
                self.by_tier[d.cascade.escalate_to] += answer
                cost = thrown + answer
        else:
            tier = self._policy.tiers[d.tier]
            source, cost = ("edge" if tier.kind == "edge" else "cloud"), costs.cost(d.tier, prompt, completion)
            self.by_tier[d.tier] += cost
        self.spend[source] += cost
        self.reference[source] += reference
        return {"cost": round(cost, 10), "reference": round(reference, 10)}

    def totals(self, decided: int) -> dict[str, Any] | None:
        costs = self._policy.costs
        if costs is None:
            return None
        spend, reference = sum(self.spend.values()), sum(self.reference.values())
        return {
            "currency": costs.currency, "reference_tier": costs.reference_tier,
            "spend": round(spend, 6), "reference": round(reference, 6), "saved": round(reference - spend, 6),
            "saved_share": round((reference - spend) / reference, 4) if reference else 0.0,
            "saved_by": {s: round(self.reference[s] - self.spend[s], 6)
                         for s in ("edge", "cache", "cascade", "cloud") if s in self.reference},
            "spend_by_tier": {t: round(v, 6) for t, v in sorted(self.by_tier.items())},
            "completion_tokens_assumed": self.assumed,
            "note": (f"{self.assumed} of {decided} requests gave no completion_tokens: priced at their max_tokens "
                     f"or {self._assumed}" if self.assumed else "every request's completion_tokens given"),
        }
