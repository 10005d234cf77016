"""policies/base: every policy model refuses unknown keys (a typo is an error, not ignored), is immutable once
loaded, and takes a field by its name or its alias (`in` in YAML, `in_` in Python)."""

from __future__ import annotations

import pytest
from pydantic import Field, ValidationError

from tiergate.policies.base import StrictModel
from tiergate.policies.model import Policy


class Condition(StrictModel):
    in_: list[str] = Field(default_factory=list, alias="in")
    min: int | None = None


def test_an_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValidationError) as info:
        Condition.model_validate({"in": ["a"], "mni": 3})
    (err,) = info.value.errors()
    assert err["type"] == "extra_forbidden" and err["loc"] == ("mni",)


def test_a_field_is_given_by_its_alias_or_its_name() -> None:
    assert Condition.model_validate({"in": ["a"]}).in_ == ["a"]
    assert Condition.model_validate({"in_": ["b"]}).in_ == ["b"]
    assert Condition(in_=["c"]).in_ == ["c"]


def test_a_loaded_model_cannot_be_changed() -> None:
    c = Condition.model_validate({"min": 1})
    with pytest.raises(ValidationError):
        c.min = 2  # type: ignore[misc]
    assert c.min == 1


def test_the_policy_models_are_strict_too() -> None:
    """A typo anywhere in a policy file is an error (the models all derive from StrictModel)."""
    with pytest.raises(ValidationError) as info:
        Policy.model_validate({"tiers": {"edge": {"kind": "edge", "model": "m", "fallback": ["x"]}}})
    assert [e["loc"] for e in info.value.errors() if e["type"] == "extra_forbidden"] == [("tiers", "edge", "fallback")]
