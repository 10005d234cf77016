"""The `when` of a policy rule: what a request must look like for the rule to match.

Each condition checks its own fields (ranges inside bounds, min <= max, exactly one form of a header test); `When`
combines them, and `covers` says when one rule's conditions shadow another's (`policies.checks` reports such
unreachable rules). `policies.engine` compiles a `When` into predicates over a request's Features.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema, field_validator, model_validator

from tiergate.core.types import Priority
from tiergate.policies.base import StrictModel

__all__ = [
    "HeaderCondition",
    "IntRange",
    "KeywordsCondition",
    "PriorityCondition",
    "PriorityName",
    "UnitRange",
    "ValuesCondition",
    "When",
]

_PRIORITY_NAMES = [p.name.lower() for p in Priority]


def _parse_priority(value: Any) -> Priority:
    if isinstance(value, Priority):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"priority must be one of {', '.join(_PRIORITY_NAMES)}")
    try:
        return Priority.parse(value)
    except ValueError:
        raise ValueError(f"unknown priority {value!r}; allowed: {', '.join(_PRIORITY_NAMES)}") from None


PriorityName = Annotated[
    Priority,
    BeforeValidator(_parse_priority),
    PlainSerializer(lambda p: p.name.lower(), return_type=str),
    WithJsonSchema({"type": "string", "enum": _PRIORITY_NAMES}),
]



def _check_min_max(lo: float | None, hi: float | None) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min ({lo}) is greater than max ({hi}); this condition can never match")


class IntRange(StrictModel):
    """An inclusive range of non-negative integers; either bound may be left out."""

    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> IntRange:
        _check_min_max(self.min, self.max)
        return self

    def contains(self, other: IntRange) -> bool:
        return (self.min is None or (other.min is not None and other.min >= self.min)) and (
            self.max is None or (other.max is not None and other.max <= self.max)
        )


class UnitRange(StrictModel):
    """An inclusive range inside [0, 1] (complexity scores)."""

    min: float | None = Field(None, ge=0.0, le=1.0)
    max: float | None = Field(None, ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> UnitRange:
        _check_min_max(self.min, self.max)
        return self

    def contains(self, other: UnitRange) -> bool:
        return (self.min is None or (other.min is not None and other.min >= self.min)) and (
            self.max is None or (other.max is not None and other.max <= self.max)
        )


class PriorityCondition(StrictModel):
    """Priority at least `min`, at most `max`, and/or one of `in` (all given parts must hold)."""

    min: PriorityName | None = None
    max: PriorityName | None = None
    in_: list[PriorityName] | None = Field(None, alias="in", min_length=1)

    @model_validator(mode="after")
    def _satisfiable(self) -> PriorityCondition:
        _check_min_max(self.min, self.max)
        if not self.allowed():
            raise ValueError("no priority satisfies both min/max and in; this condition can never match")
        return self

    def allowed(self) -> frozenset[Priority]:
        ok = set(self.in_) if self.in_ is not None else set(Priority)
        return frozenset(
            p for p in ok if (self.min is None or p >= self.min) and (self.max is None or p <= self.max)
        )


class ValuesCondition(StrictModel):
    """The value is one of `in` (exact match). A bare list (or string) is shorthand for `{in: [...]}`."""

    in_: list[Annotated[str, Field(min_length=1)]] = Field(alias="in", min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"in": [data]}
        if isinstance(data, list):
            return {"in": data}
        return data


class HeaderCondition(StrictModel):
    """A request header (name matched case-insensitively) equals a value, is one of values, or is present.

    Shorthand: a plain string means `equals`, and "*" means `present: true`.
    """

    equals: str | None = None
    in_: list[str] | None = Field(None, alias="in", min_length=1)
    present: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"present": True} if data == "*" else {"equals": data}
        return data

    @model_validator(mode="after")
    def _one(self) -> HeaderCondition:
        given = [k for k in ("equals", "in_", "present") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of equals, in, present")
        return self

    def values(self) -> frozenset[str] | None:
        """The accepted values, or None for a presence test."""
        if self.equals is not None:
            return frozenset({self.equals})
        if self.in_ is not None:
            return frozenset(self.in_)
        return None

    def implies(self, other: HeaderCondition) -> bool:
        """True when every header value satisfying self also satisfies other."""
        if other.present is not None:
            return other.present == (self.present if self.present is not None else True)
        mine, theirs = self.values(), other.values()
        return mine is not None and theirs is not None and mine <= theirs


class KeywordsCondition(StrictModel):
    """Words or phrases in the prompt, matched case-insensitively as whole words."""

    any: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)
    all: list[Annotated[str, Field(min_length=1)]] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _some(self) -> KeywordsCondition:
        if self.any is None and self.all is None:
            raise ValueError("give any and/or all")
        return self

    def implies(self, other: KeywordsCondition) -> bool:
        """True when every text matching self also matches other (conservative: may say False)."""
        mine_all = {k.lower() for k in self.all or ()}
        mine_any = {k.lower() for k in self.any or ()}
        theirs_all = {k.lower() for k in other.all or ()}
        theirs_any = {k.lower() for k in other.any or ()}
        if not theirs_all <= mine_all:
            return False
        return not theirs_any or bool(mine_all & theirs_any) or bool(mine_any and mine_any <= theirs_any)


_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1}
_VALUES_SCHEMA = {"anyOf": [_STRINGS, {"type": "string", "minLength": 1},
                            {"type": "object", "properties": {"in": _STRINGS}, "required": ["in"],
                             "additionalProperties": False}, {"type": "null"}]}
_HEADER_SCHEMA = {"anyOf": [
    {"type": "string", "description": "shorthand: the value to equal, or * for present"},
    {"type": "object", "additionalProperties": False, "minProperties": 1, "maxProperties": 1,
     "properties": {"equals": {"type": "string"}, "in": _STRINGS, "present": {"type": "boolean"}}}]}
ValuesField = Annotated[ValuesCondition | None, WithJsonSchema(_VALUES_SCHEMA)]
HeadersField = Annotated[
    dict[str, HeaderCondition] | None,
    WithJsonSchema({"anyOf": [{"type": "object", "additionalProperties": _HEADER_SCHEMA}, {"type": "null"}]}),
]


class When(StrictModel):
    """Conditions of a rule; all given conditions must hold. No conditions at all: matches everything."""

    prompt_tokens: IntRange | None = None
    priority: PriorityCondition | None = None
    complexity: UnitRange | None = None
    model: ValuesField = None
    tenant: ValuesField = None
    headers: HeadersField = None
    keywords: KeywordsCondition | None = None
    stream: bool | None = None
    edge_success: UnitRange | None = Field(None, description="the learned router's P(the edge's answer stands) "
                                                             "is in this range; never holds without a model")

    @field_validator("headers")
    @classmethod
    def _lower_names(cls, v: dict[str, HeaderCondition] | None) -> dict[str, HeaderCondition] | None:
        if v is None:
            return None
        lowered = {k.strip().lower(): c for k, c in v.items()}
        if len(lowered) != len(v):
            raise ValueError("the same header is listed twice (names are case-insensitive)")
        if any(not k for k in lowered):
            raise ValueError("empty header name")
        return lowered

    def is_catch_all(self) -> bool:
        return all(getattr(self, f) is None for f in type(self).model_fields)

    def covers(self, later: When) -> bool:
        """True when this condition provably matches every request that `later` matches."""
        if self.prompt_tokens is not None and (
            later.prompt_tokens is None or not self.prompt_tokens.contains(later.prompt_tokens)
        ):
            return False
        if self.complexity is not None and (
            later.complexity is None or not self.complexity.contains(later.complexity)
        ):
            return False
        if self.edge_success is not None and (
            later.edge_success is None or not self.edge_success.contains(later.edge_success)
        ):
            return False
        if self.priority is not None:
            theirs = later.priority.allowed() if later.priority is not None else frozenset(Priority)
            if not theirs <= self.priority.allowed():
                return False
        for field in ("model", "tenant"):
            mine: ValuesCondition | None = getattr(self, field)
            other: ValuesCondition | None = getattr(later, field)
            if mine is not None and (other is None or not set(other.in_) <= set(mine.in_)):
                return False
        if self.headers:
            theirs_h = later.headers or {}
            for name, cond in self.headers.items():
                if name not in theirs_h or not theirs_h[name].implies(cond):
                    return False
        if self.keywords is not None and (later.keywords is None or not later.keywords.implies(self.keywords)):
            return False
        return self.stream is None or later.stream == self.stream
