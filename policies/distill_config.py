"""The policy's `distill` section: which cloud answers are recorded for training the next edge model, and what is
redacted from them first (docs/policy.md, "Distillation capture").

Tested in `tests/gateway/test_distill.py`.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from tiergate.policies.base import StrictModel as _Model

__all__ = ["DistillConfig", "RedactConfig"]


class RedactConfig(_Model):
    """What is taken out of prompts and answers before a distillation record is written anywhere."""

    patterns: list[str] = Field(default_factory=list, description="regular expressions replaced by [REDACTED]")
    hook: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
                             description="module:function taking and returning text, applied after the patterns")

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as exc:
                raise ValueError(f"pattern {p!r} does not compile: {exc}") from None
        return v


class DistillConfig(_Model):
    """Record cloud answers the edge could learn from (opt-in per tenant): `tiergate distill export` turns them
    into a chat-format training set. See docs/policy.md, "Distillation capture"."""

    tenants: list[str] = Field(min_length=1, description="tenants that opted in; nothing of any other is recorded")
    rules: list[str] = Field(default_factory=list, description="record cloud answers to requests these rules "
                                                               "decided (besides escalations and fallbacks)")
    escalations: bool = Field(True, description="record the cloud's answer to every cascade escalation")
    fallbacks: bool = Field(True, description="record cloud answers to requests whose decision put an edge tier "
                                              "first (the edge failed or was full)")
    max_records: int = Field(100_000, ge=1, le=100_000_000, description="the oldest records go beyond this")
    ttl_s: int = Field(7 * 86400, ge=60, description="records older than this are dropped")
    redact: RedactConfig = Field(default_factory=RedactConfig)
