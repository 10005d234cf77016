"""policies/cascade_sim: `policy explain` says a cascade rule in words, and `policy simulate` replays the
confidence recorded per request through each rule's thresholds: kept, escalated (why), or unknown."""

from __future__ import annotations

from tiergate.core.types import Cascade, Decision
from tiergate.policies.cascade_sim import CascadeTally, describe_cascade


def _decision(rule: str, **cascade: object) -> Decision:
    return Decision(rule=rule, tier="edge", fallbacks=("cloud",), cascade=Cascade(escalate_to="cloud", **cascade))


def test_a_rule_is_described_with_its_thresholds_window_target_and_budget() -> None:
    c = Cascade(escalate_to="cloud", min_mean_logprob=-0.5, min_token_logprob=-4.0, min_margin=1.5, first_tokens=8,
                budget_s=2.5)
    assert describe_cascade("edge", c) == (
        "answer from edge first; keep it if mean log-probability >= -0.5 and every token's >= -4.0 and "
        "mean top-2 margin >= 1.5 over the first 8 tokens, else escalate to cloud "
        "(also when cut at max_tokens or empty); edge gets 2.5 s to a decision")


def test_a_description_leaves_out_what_the_rule_does_not_check() -> None:
    c = Cascade(escalate_to="big", min_margin=0.5, escalate_on_length=False, escalate_on_empty=False)
    assert describe_cascade("small", c) == ("answer from small first; keep it if mean top-2 margin >= 0.5 over the "
                                            "whole answer, else escalate to big; small gets 10 s to a decision")
    only_empty = Cascade(escalate_to="big", min_mean_logprob=-1, escalate_on_length=False)
    assert "(also when empty)" in describe_cascade("small", only_empty)


def test_each_row_is_kept_escalated_with_its_reason_or_unknown() -> None:
    tally = CascadeTally()
    d = _decision("chat", min_mean_logprob=-0.5)
    assert tally.add(d, {"mean_logprob": -0.2, "tokens": 8, "finish_reason": "stop"}) == "kept"
    assert tally.add(d, {"mean_logprob": -0.9, "tokens": 8}) == "escalated:low_mean_logprob"
    assert tally.add(d, {"mean_logprob": -0.1, "finish_reason": "length"}) == "escalated:length"
    assert tally.add(d, {"mean_logprob": -0.1, "text": "  "}) == "escalated:empty"
    assert tally.add(d, None) == "unknown"  # nothing recorded for this request
    assert tally.add(d, "not an object") == "unknown"


def test_totals_per_rule_and_the_cost_of_escalating() -> None:
    tally = CascadeTally()
    chat, code = _decision("chat", min_mean_logprob=-0.5), _decision("code", min_margin=1.0)
    tally.add(chat, {"mean_logprob": -0.1, "edge_tokens": 30})
    tally.add(chat, {"mean_logprob": -0.9, "edge_tokens": 40})
    tally.add(chat, None)
    tally.add(code, {"mean_margin": 0.2, "edge_tokens": 50})
    tally.add(code, {"mean_logprob": -0.1, "edge_tokens": 7})  # no margin recorded: cannot be kept on margin
    totals = tally.totals(decided=10)  # ten requests decided, five of them by cascade rules
    assert totals["rules"] == {
        "chat": {"requests": 3, "with_confidence": 2, "kept": 1, "escalated": 1, "kept_share": 0.5},
        "code": {"requests": 2, "with_confidence": 2, "kept": 0, "escalated": 2, "kept_share": 0.0},
    }
    assert totals["escalated_share_of_all"] == 0.3
    assert totals["escalated_edge_tokens"] == 40 + 50 + 7  # kept answers' tokens were not wasted


def test_totals_of_nothing_judged_have_no_shares_rather_than_dividing_by_zero() -> None:
    tally = CascadeTally()
    assert tally.totals(decided=0)["escalated_share_of_all"] == 0.0
    tally.add(_decision("chat", min_mean_logprob=-1), None)
    assert tally.totals(decided=1)["rules"]["chat"]["kept_share"] is None
