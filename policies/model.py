"""The routing policy file as typed pydantic models.

Field-level rules (types, ranges, unknown keys, min <= max) live on the models so every error carries
the path of the offending field; checks across the file (unknown tier, fallback loops, duplicate or
unreachable rules) live in `policies.checks`. A `Policy` that passed both is safe to hand to `PolicyEngine`.

Tested in `tests/policies/test_engine.py`, `tests/policies/test_loader.py`, `tests/fuzz/test_policy_loader.py`
and others.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    PrivateAttr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from tiergate.core.types import Priority
from tiergate.policies.base import StrictModel
from tiergate.policies.distill_config import DistillConfig

__all__ = [
    "BUILTIN_TOKENIZER",
    "DEFAULT_RULE_NAME",
    "CacheOverride",
    "CascadeAction",
    "Defaults",
    "DiscoveryConfig",
    "HeaderCondition",
    "IntRange",
    "KeywordsCondition",
    "Policy",
    "PriorityCondition",
    "PriorityName",
    "QueueConfig",
    "RejectAction",
    "Rule",
    "TierConfig",
    "TimeoutsOverride",
    "UnitRange",
    "ValuesCondition",
    "When",
]

DEFAULT_RULE_NAME = "default"  # the implicit last rule that `default_tier` stands for
BUILTIN_TOKENIZER = "builtin:default"  # the BERT WordPiece tokenizer shipped with the gateway
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"  # rule and tier names travel in headers and metric labels
_RESERVED_TIERS = frozenset({"cache"})  # x-tiergate-tier: cache means "answered from the cache"
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


_Model = StrictModel


def _check_min_max(lo: float | None, hi: float | None) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"min ({lo}) is greater than max ({hi}); this condition can never match")


# ----------------------------------------------------------------------------------------- conditions


class IntRange(_Model):
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


class UnitRange(_Model):
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


class PriorityCondition(_Model):
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


class ValuesCondition(_Model):
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


class HeaderCondition(_Model):
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


class KeywordsCondition(_Model):
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


class When(_Model):
    """Conditions of a rule; all given conditions must hold. No conditions at all: matches everything."""

    prompt_tokens: IntRange | None = None
    priority: PriorityCondition | None = None
    complexity: UnitRange | None = None
    model: ValuesField = None
    tenant: ValuesField = None
    headers: HeadersField = None
    keywords: KeywordsCondition | None = None
    stream: bool | None = None

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


# -------------------------------------------------------------------------------------------- actions


class CacheOverride(_Model):
    """Semantic-cache settings; anything left out is inherited (built-in defaults < `defaults` < rule)."""

    enabled: bool | None = None
    semantic: bool | None = None
    threshold: float | None = Field(None, ge=0.0, le=1.0, description="minimum cosine similarity for a hit")
    ttl_s: int | None = Field(None, ge=0, description="seconds an answer stays in the cache")
    max_temperature: float | None = Field(None, ge=0.0, le=2.0)
    max_false_hit_rate: float | None = Field(
        None, gt=0.0, lt=1.0, description="error-bounded semantic hits: the largest share of wrong semantic hits "
        "to allow (e.g. 0.05); `threshold` then no longer decides (docs/cache.md)")
    verify_rate: float | None = Field(None, ge=0.0, le=1.0, description="with max_false_hit_rate: the share of "
                                      "would-be semantic hits sent to the tier to check them")
    verify_mode: Literal["tier", "shadow"] | None = Field(
        None, description="with max_false_hit_rate: who answers a would-be hit sampled for verification: `tier` "
        "(default; the client waits for the tier's answer) or `shadow` (the client gets the cached answer at once "
        "and the request is also sent to the tier in the background)")


class TimeoutsOverride(_Model):
    """Upstream timeouts in seconds; anything left out is inherited (defaults < tier < rule)."""

    connect_s: float | None = Field(None, gt=0)
    first_byte_s: float | None = Field(None, gt=0)
    between_chunks_s: float | None = Field(None, gt=0)
    total_s: float | None = Field(None, gt=0)
    queue_s: float | None = Field(None, ge=0)


class RejectAction(_Model):
    status: int = Field(ge=400, le=599, description="HTTP status of the error answer")
    message: str = Field(min_length=1)
    code: str = Field("rejected_by_policy", pattern=r"^[a-z0-9_]+$")


class CascadeAction(_Model):
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


class Rule(_Model):
    """One routing rule: if `when` holds, send to `tier` (then `fallbacks`) or `reject`."""

    name: str = Field(pattern=_NAME, description="shown in x-tiergate-rule and in metric labels")
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


# ---------------------------------------------------------------------------------------------- tiers


class QueueConfig(_Model):
    """Requests waiting for a free slot when the tier is at max_concurrency (highest priority first)."""

    max_waiting: int = Field(64, ge=0, description="beyond this many waiting requests, shed with 429/503")
    max_wait_s: float | None = Field(
        None, ge=0, le=3600, description="longest wait before shedding or overflowing; default: timeouts.queue_s"
    )


class DiscoveryConfig(_Model):
    """Find backends by resolving a DNS name (e.g. a Kubernetes headless service) to all its addresses."""

    dns: str = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
    port: int = Field(ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(10.0, gt=0, description="seconds between resolutions")


class RoutingConfig(_Model):
    """How a cloud tier picks one of its vLLM servers for a request (docs/cloud.md, gateway.pools.selection)."""

    strategy: Literal["prefix", "round_robin", "least_load"] = Field(
        "prefix", description="prefix: prefix affinity bounded by load; or round_robin, least_load")
    load_bound: float = Field(
        1.2, ge=1.0, le=10.0,
        description="prefix only: a server takes a request while its load stays within ceil(load_bound x its fair "
                    "share); lower balances more (1.2 keeps max/mean load <= 1.3 even under one hot prefix), "
                    "higher keeps more prefixes on their server")
    cached_load_bound: float | None = Field(
        None, ge=1.0, le=15.0,
        description="prefix only: the bound for a server that probably holds the request's prefix in its KV cache "
                    "(it was sent that prefix recently; gateway.pools.prefix_memory), since the request costs it only "
                    "the uncached suffix; default 1.5 x load_bound, equal to load_bound turns the allowance off")
    affinity_chars: int = Field(
        256, ge=16, le=65_536, description="prefix only: characters of the prompt's start that pick the server")
    max_num_seqs: int | None = Field(
        None, ge=1, description="each server's vLLM --max-num-seqs, the denominator of its load; default 256")

    @model_validator(mode="after")
    def _cached_not_below(self) -> RoutingConfig:
        if self.cached_load_bound is not None and self.cached_load_bound < self.load_bound:
            raise ValueError(f"cached_load_bound ({self.cached_load_bound:g}) must be >= load_bound "
                             f"({self.load_bound:g}): a cached request costs its server less, not more")
        return self


_URL = re.compile(r"^https?://[^\s/:]+(:\d{1,5})?(/[^\s]*)?$")


class TierConfig(_Model):
    """A pool of OpenAI-compatible backends serving one model."""

    name: str = Field("", description="filled in from the key under `tiers`")
    kind: Literal["edge", "cloud"]
    model: str = Field(min_length=1, description="public model name listed by /v1/models")
    served_model: str | None = Field(
        None, description="model name the backends serve (vLLM --served-model-name); default: `model`")
    description: str = ""
    endpoints: list[str] = Field(default_factory=list, description="static base URLs, without /v1")
    discovery: DiscoveryConfig | None = None
    routing: RoutingConfig | None = Field(
        None, description="cloud tiers of vLLM servers: how one server is picked (default: prefix affinity)")
    tokenizer: str | None = Field(
        None, description="tokenizer.json path (relative to the policy file), HF model name, or builtin:default"
    )
    max_context: int = Field(8192, gt=0, description="context window in tokens")
    logprobs: bool = Field(True, description="the backends report token log-probabilities (a cascade needs them)")
    max_concurrency: int | None = Field(
        None, gt=0, description="requests in flight per gateway process; default: what the backends report"
    )
    queue: QueueConfig = Field(default_factory=QueueConfig)
    stand_in: bool = Field(False, description="true when a 'cloud' tier is a local stand-in, not vLLM")
    fallbacks: list[str] = Field(default_factory=list, description="default fallbacks for rules naming this tier")
    timeouts: TimeoutsOverride | None = None

    @field_validator("endpoints")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        out = []
        for url in v:
            url = url.strip().rstrip("/")
            if not _URL.match(url):
                raise ValueError(f"{url!r} is not an http(s) base URL like http://10.0.0.5:8000")
            if url.endswith("/v1"):
                raise ValueError(f"{url!r}: give the base URL without /v1 (the gateway adds it)")
            out.append(url)
        if len(set(out)) != len(out):
            raise ValueError("the same endpoint is listed twice")
        return out


class Defaults(_Model):
    cache: CacheOverride = Field(default_factory=CacheOverride)
    timeouts: TimeoutsOverride | None = None
    max_tokens: int | None = Field(None, ge=1, description="cap on max_tokens unless a rule sets its own")
    tokenizer: str | None = Field(None, description="tokenizer for requests that name no tier's model")


class Policy(_Model):
    """A whole policy file. Build with `policies.loader.load_policy`/`parse_policy`, which also run the checks."""

    version: Literal[1] = 1
    description: str = ""
    tiers: dict[str, TierConfig] = Field(min_length=1)
    defaults: Defaults = Field(default_factory=Defaults)
    default_tier: str | None = Field(None, description="where requests go when no rule matches")
    complexity_model: str | None = Field(None, description="complexity model .json; default: the shipped one")
    rules: list[Rule] = Field(default_factory=list)
    distill: DistillConfig | None = Field(None, description="distillation capture (off unless configured)")

    _source: str = PrivateAttr("<memory>")
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)
    _warnings: tuple[str, ...] = PrivateAttr(())

    @model_validator(mode="before")
    @classmethod
    def _name_tiers(cls, data: Any) -> Any:
        tiers = data.get("tiers") if isinstance(data, dict) else None
        if isinstance(tiers, dict):
            named = {}
            for key, cfg in tiers.items():
                if isinstance(cfg, dict):
                    cfg = dict(cfg)
                    cfg.setdefault("name", key)
                named[key] = cfg
            data = {**data, "tiers": named}
        return data

    @field_validator("tiers")
    @classmethod
    def _tier_names(cls, v: dict[str, TierConfig]) -> dict[str, TierConfig]:
        for key, tier in v.items():
            if not re.match(_NAME, key):
                raise ValueError(f"tier name {key!r} must be letters, digits, '_', '.', '-' (max 63)")
            if key in _RESERVED_TIERS:
                raise ValueError(f"tier name {key!r} is reserved (x-tiergate-tier: cache marks cache answers)")
            if tier.name != key:
                raise ValueError(f"tier {key!r} has name {tier.name!r}; leave name out or make it match the key")
        return v

    @property
    def source(self) -> str:
        return self._source

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the policy (tokenizers, complexity model) resolve against."""
        return self._base_dir

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    def bind(self, source: str, base_dir: Path, warnings: tuple[str, ...] = ()) -> Policy:
        """Record where the policy came from (set once by the loader)."""
        self._source, self._base_dir, self._warnings = source, base_dir, warnings
        return self

    def resolve_path(self, value: str) -> Path:
        p = Path(value).expanduser()
        return p if p.is_absolute() else self._base_dir / p

    def tier_for_model(self, model: str) -> TierConfig | None:
        """The tier whose public model name is `model`, if any."""
        for tier in self.tiers.values():
            if tier.model == model:
                return tier
        return None

    def effective_rules(self) -> list[Rule]:
        """The rules in order, with `default_tier` appended as a last catch-all rule named 'default'."""
        rules = list(self.rules)
        if self.default_tier is not None and not (rules and rules[-1].when.is_catch_all()):
            rules.append(Rule(name=DEFAULT_RULE_NAME, tier=self.default_tier,
                              description="default_tier: no earlier rule matched"))
        return rules

    def cascade_target(self, rule: Rule) -> str | None:
        """Where a cascade rule escalates: its `escalate_to`, else the first tier of its fallback chain."""
        if rule.cascade is None:
            return None
        if rule.cascade.escalate_to is not None:
            return rule.cascade.escalate_to
        chain = self.fallback_chain(rule)
        return chain[0] if chain else None

    def fallback_chain(self, rule: Rule) -> tuple[str, ...]:
        """Tiers to try after the rule's tier: the rule's own list, else the tiers' default fallbacks."""
        if rule.tier is None:
            return ()
        if rule.fallbacks is not None:
            return tuple(rule.fallbacks)
        chain: list[str] = []
        seen = {rule.tier}
        frontier = [rule.tier]
        while frontier:
            nxt = []
            for name in frontier:
                for fb in self.tiers[name].fallbacks if name in self.tiers else ():
                    if fb not in seen:
                        seen.add(fb)
                        chain.append(fb)
                        nxt.append(fb)
            frontier = nxt
        return tuple(chain)
