"""policies/conditions: each condition of a rule's `when` checks its own fields, accepts its shorthands, and
`When.covers` says when one rule's conditions match everything another's do (the unreachable-rule check)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tiergate.core.types import Priority
from tiergate.policies.conditions import (
    HeaderCondition,
    IntRange,
    KeywordsCondition,
    PriorityCondition,
    UnitRange,
    ValuesCondition,
    When,
)


def test_a_range_with_min_above_max_can_never_match() -> None:
    with pytest.raises(ValidationError, match="can never match"):
        IntRange(min=10, max=5)
    with pytest.raises(ValidationError):
        UnitRange(max=1.5)
    assert IntRange(min=0, max=100).contains(IntRange(min=10, max=20))
    assert not IntRange(min=0, max=100).contains(IntRange(min=10))  # open above: not inside


def test_priorities_by_name_or_number_and_the_ones_allowed() -> None:
    cond = PriorityCondition.model_validate({"min": "normal", "in": ["low", "high", 3]})
    assert cond.allowed() == frozenset(p for p in (Priority.parse("high"), Priority.parse(3)) if p >= Priority.NORMAL)
    with pytest.raises(ValidationError, match="unknown priority"):
        PriorityCondition.model_validate({"min": "urgentest"})
    with pytest.raises(ValidationError, match="no priority satisfies"):
        PriorityCondition.model_validate({"min": "high", "in": ["low"]})


def test_values_and_headers_take_their_shorthands() -> None:
    assert ValuesCondition.model_validate("gpt").in_ == ["gpt"]
    assert ValuesCondition.model_validate(["a", "b"]).in_ == ["a", "b"]
    assert HeaderCondition.model_validate("*").present is True
    assert HeaderCondition.model_validate("beta").values() == frozenset({"beta"})
    with pytest.raises(ValidationError, match="exactly one"):
        HeaderCondition.model_validate({"equals": "a", "present": True})


def test_implication_between_header_and_keyword_conditions() -> None:
    beta = HeaderCondition.model_validate("beta")
    assert beta.implies(HeaderCondition.model_validate({"in": ["alpha", "beta"]}))
    assert beta.implies(HeaderCondition.model_validate("*"))
    assert not HeaderCondition.model_validate("*").implies(beta)
    both = KeywordsCondition.model_validate({"all": ["SQL", "join"]})
    assert both.implies(KeywordsCondition.model_validate({"any": ["sql"]}))
    assert not KeywordsCondition.model_validate({"any": ["sql"]}).implies(both)


def test_header_names_are_case_insensitive_and_listed_once() -> None:
    assert set(When.model_validate({"headers": {"X-Team": "a"}}).headers or {}) == {"x-team"}
    with pytest.raises(ValidationError, match="listed twice"):
        When.model_validate({"headers": {"X-Team": "a", "x-team": "b"}})


def test_a_when_covers_the_narrower_conditions_of_a_later_rule() -> None:
    broad = When.model_validate({"prompt_tokens": {"min": 100}, "model": ["a", "b"]})
    narrow = When.model_validate({"prompt_tokens": {"min": 200, "max": 300}, "model": "a", "stream": True})
    assert When().is_catch_all() and not broad.is_catch_all()
    assert broad.covers(narrow) and not narrow.covers(broad)
    assert When().covers(broad)
