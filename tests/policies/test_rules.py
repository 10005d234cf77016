"""policies/rules: a rule has exactly one action (a tier or a rejection), a name fit for headers and metric
labels, and a cascade only with a signal to judge the first answer by."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tiergate.policies.rules import CascadeAction, RejectAction, Rule


def test_a_rule_routes_to_a_tier_or_rejects_not_both() -> None:
    assert Rule(name="r", tier="edge").when.is_catch_all()
    reject = RejectAction(status=403, message="no")
    assert Rule(name="r", reject=reject).reject == reject and reject.code == "rejected_by_policy"
    for bad in ({}, {"tier": "edge", "reject": reject}, {"reject": reject, "fallbacks": ["cloud"]},
                {"reject": reject, "cascade": CascadeAction(min_margin=1.0)}):
        with pytest.raises(ValidationError):
            Rule(name="r", **bad)


@pytest.mark.parametrize("name", ["", "-lead", "has space", "x" * 64])
def test_rule_names_fit_in_headers_and_metric_labels(name: str) -> None:
    with pytest.raises(ValidationError):
        Rule(name=name, tier="edge")


def test_a_cascade_needs_a_confidence_signal() -> None:
    with pytest.raises(ValidationError, match="at least one of"):
        CascadeAction()
    cascade = CascadeAction(min_mean_logprob=-0.5)
    assert cascade.escalate_on_length and cascade.escalate_on_empty and cascade.budget_s == 10.0
    with pytest.raises(ValidationError):
        CascadeAction(min_mean_logprob=0.5)  # a log-probability is never above 0
