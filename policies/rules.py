"""A policy rule: if its `when` holds, send the request to a tier (with fallbacks, maybe as a confidence
cascade) or reject it."""

from __future__ import annotations

from pydantic import Field, model_validator

from tiergate.policies.base import NAME_PATTERN, StrictModel
from tiergate.policies.conditions import When
from tiergate.policies.overrides import CacheOverride, TimeoutsOverride

__all__ = ["CascadeAction", "RejectAction", "Rule"]


class RejectAction(StrictModel):
    """Answer with an error instead of a model. Its OpenAI error type follows `status` (`core.errors.error_type`:
    a 503 is a `server_error`, a 429 a `rate_limit_error`, other 4xx an `invalid_request_error`)."""

    status: int = Field(ge=400, le=599, description="HTTP status of the error answer")
    message: str = Field(min_length=1)
    code: str = Field("rejected_by_policy", pattern=r"^[a-z0-9_]+$")
    retry_after_s: int | None = Field(None, ge=1, le=86_400, description="seconds a client should wait before "
                                      "retrying, sent as Retry-After; only with status 429 or 503")

    @model_validator(mode="after")
    def _retry_after_fits(self) -> RejectAction:
        if self.retry_after_s is not None and self.status not in (429, 503):
            raise ValueError(f"retry_after_s goes with status 429 or 503 (Retry-After), not {self.status}")
        return self


class CascadeAction(StrictModel):
    """Answer from `tier` first and keep it only if the model was sure of it (token log-probabilities); otherwise
    escalate to `escalate_to` (default: the rule's first fallback). See docs/policy.md, "Confidence cascade"."""

    escalate_to: str | None = Field(None, description="tier that answers when the first one is unsure")
    min_mean_logprob: float | None = Field(None, le=0, description="keep when the mean token log-probability is "
                                                                    "at least this (e.g. -0.5)")
    min_token_logprob: float | None = Field(None, le=0, description="keep only if no token is below this")
    min_margin: float | None = Field(None, ge=0, description="keep when the mean top-1/top-2 log-probability "
                                                            "margin is at least this")
    first_tokens: int | None = Field(None, ge=1, le=256, description="judge on the first N tokens (a stream is "
                                                                     "held only that long); default: the whole answer")
    escalate_on_length: bool = Field(True, description="an answer cut at max_tokens escalates")
    escalate_on_empty: bool = Field(True, description="an empty answer escalates")
    budget_s: float = Field(10.0, gt=0, le=600, description="the first tier's time to a decision; then it escalates")

    @model_validator(mode="after")
    def _some_signal(self) -> CascadeAction:
        if self.min_mean_logprob is None and self.min_token_logprob is None and self.min_margin is None:
            raise ValueError("a cascade needs at least one of min_mean_logprob, min_token_logprob, min_margin")
        return self


class Rule(StrictModel):
    """One routing rule: if `when` holds, send to `tier` (then `fallbacks`) or `reject`."""

    name: str = Field(pattern=NAME_PATTERN, description="shown in x-tiergate-rule and in metric labels")
    description: str = ""
    when: When = Field(default_factory=When)
    tier: str | None = None
    fallbacks: list[str] | None = Field(None, description="tiers to try in order when `tier` fails or is full")
    cache: CacheOverride | None = None
    max_tokens: int | None = Field(None, ge=1, description="cap on the request's max_tokens")
    timeouts: TimeoutsOverride | None = None
    reject: RejectAction | None = None
    cascade: CascadeAction | None = Field(None, description="keep the tier's answer only if it was sure of it")

    @model_validator(mode="after")
    def _one_action(self) -> Rule:
        if (self.tier is None) == (self.reject is None):
            raise ValueError("a rule needs exactly one of tier or reject")
        if self.reject is not None and self.fallbacks:
            raise ValueError("a reject rule cannot have fallbacks")
        if self.reject is not None and self.cascade is not None:
            raise ValueError("a reject rule cannot cascade")
        return self
