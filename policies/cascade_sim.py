"""`policy simulate` for cascade rules: replay the confidence recorded for each request (a traffic line's `cascade`
object, as bench/cascade writes it) through each rule's thresholds, and estimate the share kept on the first tier
and what the escalations cost (requests and first-tier tokens that went to the cloud anyway)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tiergate.core.types import Cascade, Decision
from tiergate.policies.confidence import judge_recorded

__all__ = ["CascadeTally", "describe_cascade"]


def describe_cascade(tier: str, c: Cascade) -> str:
    """The rule in words, for `policy explain`."""
    tests = [f"mean log-probability >= {c.min_mean_logprob}" if c.min_mean_logprob is not None else "",
             f"every token's >= {c.min_token_logprob}" if c.min_token_logprob is not None else "",
             f"mean top-2 margin >= {c.min_margin}" if c.min_margin is not None else ""]
    over = f"the first {c.first_tokens} tokens" if c.first_tokens else "the whole answer"
    also = [w for w, on in (("cut at max_tokens", c.escalate_on_length), ("empty", c.escalate_on_empty)) if on]
    return (f"answer from {tier} first; keep it if {' and '.join(t for t in tests if t)} over {over}, "
            f"else escalate to {c.escalate_to}" + (f" (also when {' or '.join(also)})" if also else "")
            + f"; {tier} gets {c.budget_s:g} s to a decision")


class CascadeTally:
    def __init__(self) -> None:
        self._by_rule: dict[str, Counter[str]] = {}
        self._edge_tokens_wasted = 0

    def add(self, decision: Decision, recorded: Any) -> str:
        """The row's outcome: kept, escalated (with its reason), or unknown (nothing recorded)."""
        assert decision.cascade is not None
        counts = self._by_rule.setdefault(decision.rule, Counter())
        counts["requests"] += 1
        if not isinstance(recorded, dict):
            counts["unknown"] += 1
            return "unknown"
        v = judge_recorded(decision.cascade, recorded)
        counts["kept" if v.keep else "escalated"] += 1
        if not v.keep:
            self._edge_tokens_wasted += int(recorded.get("edge_tokens", 0))
            return f"escalated:{v.reason}"
        return "kept"

    def totals(self, decided: int) -> dict[str, Any]:
        rules = {}
        for rule, c in self._by_rule.items():
            judged = c["kept"] + c["escalated"]
            rules[rule] = {"requests": c["requests"], "with_confidence": judged, "kept": c["kept"],
                           "escalated": c["escalated"], "kept_share": round(c["kept"] / judged, 4) if judged else None}
        escalated = sum(c["escalated"] for c in self._by_rule.values())
        return {"rules": rules, "escalated_share_of_all": round(escalated / decided, 4) if decided else 0.0,
                "escalated_edge_tokens": self._edge_tokens_wasted,
                "note": "escalated requests are answered by both tiers: the first tier's tokens are spent for nothing"}
