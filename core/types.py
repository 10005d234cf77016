"""The values that cross the boundary between classification, policy and dispatch.

`Features` is what the gateway knows about a request before routing it; `Decision` is what
the policy makes of it. Both are frozen: computed once per request, then only read.

Tested in `tests/fuzz/test_policy_loader.py`, `tests/gateway/test_admission.py`, `tests/gateway/test_auth.py`
and others.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Literal

from tiergate.core.errors import OpenAIError, error_type

__all__ = ["CacheRule", "Cascade", "Decision", "Features", "Priority", "Reject", "Timeouts"]


class Priority(IntEnum):
    """Request priority; a higher value is served first when a tier is saturated."""

    LOW = 0
    NORMAL = 1
    HIGH = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, value: str | int) -> Priority:
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[value.strip().upper()]
        except KeyError:
            allowed = ", ".join(p.name.lower() for p in cls)
            raise ValueError(f"unknown priority {value!r}; allowed: {allowed}") from None


@dataclass(frozen=True, slots=True)
class Features:
    """Everything the policy may look at, computed once per request."""

    prompt_tokens: int
    priority: Priority
    complexity: float  # in [0, 1]; higher means more likely to need the strong (cloud) model
    requested_model: str  # "auto" or a model listed by /v1/models
    tenant: str
    text: str = ""  # the prompt text, for keyword conditions
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-cased request headers
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    # P(the edge's answer stands), from the learned router (gateway.learned_router); None: no model (cold start),
    # and then no `edge_success` condition holds.
    edge_success: float | None = None


@dataclass(frozen=True, slots=True)
class CacheRule:
    """How the semantic cache treats a request that matched a rule."""

    enabled: bool = True
    semantic: bool = True
    threshold: float = 0.94  # minimum cosine similarity for a semantic hit (guards apply on top)
    ttl_s: int = 3600
    max_temperature: float = 0.3  # requests sampled hotter than this are neither looked up nor stored
    # Error-bounded semantic hits (cache.errbound): None = `threshold` decides; else the largest share of wrong
    # semantic hits to allow, and the share of would-be hits sent to the tier to check them.
    max_false_hit_rate: float | None = None
    verify_rate: float = 0.03
    # Who answers a would-be hit sampled for verification: "tier" (the client gets the tier's answer, which is then
    # compared with the cached one) or "shadow" (the client gets the cached answer at once and the request is also
    # sent to the tier in the background, to compare; the hit counts as served).
    verify_mode: Literal["tier", "shadow"] = "tier"


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 2.0
    first_byte_s: float = 60.0
    between_chunks_s: float = 30.0
    total_s: float = 600.0
    queue_s: float = 5.0  # longest wait for a free slot on a saturated tier before shedding


@dataclass(frozen=True, slots=True)
class Reject:
    """A policy rule's refusal: the error answer it becomes (`error`)."""

    status: int
    message: str
    code: str = "rejected_by_policy"
    retry_after_s: int | None = None  # sent as Retry-After (the policy allows it on 429 and 503 only)

    def error(self) -> OpenAIError:
        """The OpenAI error: its type follows the status (a 503 is a `server_error`, a 429 a `rate_limit_error`,
        `core.errors.error_type`), with Retry-After when the rule gives one."""
        headers = {"retry-after": str(self.retry_after_s)} if self.retry_after_s is not None else None
        return OpenAIError(self.status, self.message, type=error_type(self.status), code=self.code, headers=headers)


@dataclass(frozen=True, slots=True)
class Cascade:
    """Try the decision's tier first, keep its answer only if the model was sure of it, else escalate.

    Thresholds are on the answer's token log-probabilities (policies/confidence.py): the mean and the minimum
    over the first `first_tokens` tokens (the whole answer when None), and the mean top-1/top-2 margin. A
    threshold left None is not checked. An answer cut at max_tokens or an empty one escalates when asked to.
    A streaming answer is held back until the decision: `first_tokens` bounds how long.
    """

    escalate_to: str
    min_mean_logprob: float | None = None
    min_token_logprob: float | None = None
    min_margin: float | None = None
    first_tokens: int | None = None
    escalate_on_length: bool = True
    escalate_on_empty: bool = True
    budget_s: float = 10.0  # the edge attempt's time, from dispatch to the decision; then it escalates


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and under which rules; `rule` names the policy rule that decided."""

    rule: str
    tier: str | None  # None only when `reject` is set
    fallbacks: tuple[str, ...] = ()
    cache: CacheRule = CacheRule()
    max_tokens_cap: int | None = None
    timeouts: Timeouts = Timeouts()
    reject: Reject | None = None
    cascade: Cascade | None = None

    @property
    def tiers(self) -> tuple[str, ...]:
        """The tier then its fallbacks, in the order dispatch tries them."""
        return ((self.tier,) if self.tier else ()) + self.fallbacks
