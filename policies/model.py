"""The routing policy file as typed pydantic models.

Field-level rules (types, ranges, unknown keys, min <= max) live on the models so every error carries
the path of the offending field; checks across the file (unknown tier, fallback loops, duplicate or
unreachable rules) live in `policies.checks`. A `Policy` that passed both is safe to hand to `PolicyEngine`.

The sections live in their own modules: `policies.conditions` (a rule's `when`), `policies.rules`,
`policies.overrides` (cache and timeout settings), `policies.tier_config`, `policies.distill_config`,
`policies.costs`, `policies.budgets` and `policies.router_config`.

Tested in `tests/policies/test_engine.py`, `tests/policies/test_loader.py`, `tests/fuzz/test_policy_loader.py`
and others.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from tiergate.policies.base import NAME_PATTERN, StrictModel
from tiergate.policies.budgets import BudgetsConfig
from tiergate.policies.costs import CostsConfig
from tiergate.policies.distill_config import DistillConfig
from tiergate.policies.overrides import CacheOverride, TimeoutsOverride
from tiergate.policies.router_config import RouterConfig
from tiergate.policies.rules import Rule
from tiergate.policies.tier_config import TierConfig

__all__ = ["AUTO_MODEL", "BUILTIN_TOKENIZER", "DEFAULT_RULE_NAME", "Defaults", "Policy"]

AUTO_MODEL = "auto"  # the model name that lets the policy choose the tier
DEFAULT_RULE_NAME = "default"  # the implicit last rule that `default_tier` stands for
BUILTIN_TOKENIZER = "builtin:default"  # the BERT WordPiece tokenizer shipped with the gateway
_RESERVED_TIERS = frozenset({"cache"})  # x-tiergate-tier: cache means "answered from the cache"


class Defaults(StrictModel):
    cache: CacheOverride = Field(default_factory=CacheOverride)
    timeouts: TimeoutsOverride | None = None
    max_tokens: int | None = Field(None, ge=1, description="cap on max_tokens unless a rule sets its own")
    tokenizer: str | None = Field(None, description="tokenizer for requests that name no tier's model")


class Policy(StrictModel):
    """A whole policy file. Build with `policies.loader.load_policy`/`parse_policy`, which also run the checks."""

    version: Literal[1] = 1
    description: str = ""
    tiers: dict[str, TierConfig] = Field(min_length=1)
    defaults: Defaults = Field(default_factory=Defaults)
    default_tier: str | None = Field(None, description="where requests go when no rule matches")
    complexity_model: str | None = Field(None, description="complexity model .json; default: the shipped one")
    rules: list[Rule] = Field(default_factory=list)
    distill: DistillConfig | None = Field(None, description="distillation capture (off unless configured)")
    costs: CostsConfig | None = Field(None, description="prices per tier and the reference tier savings are "
                                                        "measured against (no section: spend is not counted)")
    budgets: BudgetsConfig | None = Field(None, description="spend limits per tenant and key, in the `costs` "
                                                            "currency (policies.budgets)")
    router: RouterConfig | None = Field(None, description="the learned pre-generation router: outcome records, "
                                                         "the model edge_success reads, exploration")
    model_aliases: dict[str, str] = Field(
        default_factory=dict, description="model names clients send (exact, or a glob such as `claude-*`) -> "
                                          "`auto` or a tier name, so unmodified apps keep their own model names")

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
            if not re.match(NAME_PATTERN, key):
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

    def alias_for(self, model: str) -> tuple[str, str] | None:
        """The alias that applies to a model name no tier serves: (its pattern, its target: `auto` or a tier name).
        An exact alias wins over a glob; globs are tried in file order (`fnmatchcase`: model names are
        case-sensitive)."""
        if model == AUTO_MODEL or self.tier_for_model(model) is not None:
            return None
        if (target := self.model_aliases.get(model)) is not None:
            return model, target
        return next(((p, t) for p, t in self.model_aliases.items() if fnmatch.fnmatchcase(model, p)), None)

    def resolve_model(self, model: str) -> str:
        """The model a request naming `model` is served as: `auto` or a tier's public model name through an alias,
        else `model` itself (a tier's name, `auto`, or one nobody serves: the caller answers 404)."""
        alias = self.alias_for(model)
        if alias is None:
            return model
        return alias[1] if alias[1] == AUTO_MODEL else self.tiers[alias[1]].model

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
