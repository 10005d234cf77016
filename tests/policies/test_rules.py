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


def test_a_reject_may_say_when_to_retry_only_where_retry_after_means_something() -> None:
    assert RejectAction(status=503, message="down", retry_after_s=30).retry_after_s == 30
    assert RejectAction(status=429, message="busy", retry_after_s=1).retry_after_s == 1
    assert RejectAction(status=503, message="down").retry_after_s is None
    with pytest.raises(ValidationError, match="retry_after_s goes with status 429 or 503"):
        RejectAction(status=400, message="bad", retry_after_s=5)
    for bad in (0, -1, 86_401):
        with pytest.raises(ValidationError, match="retry_after_s"):
            RejectAction(status=503, message="down", retry_after_s=bad)


def test_a_bad_retry_after_in_a_policy_file_is_an_error_at_its_field() -> None:
    from tiergate.policies.loader import PolicyError, parse_policy

    text = """version: 1
tiers: {edge: {kind: edge, model: tiergate-edge, tokenizer: "builtin:default"}}
rules:
  - {name: down, reject: {status: 503, message: "down", retry_after_s: 0}}
"""
    with pytest.raises(PolicyError) as err:
        parse_policy(text)
    assert [p.field for p in err.value.problems] == ["rules[0].reject.retry_after_s"], str(err.value)
    assert "greater than or equal to 1" in str(err.value)
