"""Settings a policy rule inherits and may override: the semantic cache's and the upstream timeouts.

Anything left out is inherited: built-in defaults < the policy's `defaults` < the tier (timeouts) < the rule.
`policies.engine` merges them into the `CacheRule` and `Timeouts` of a decision.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tiergate.policies.base import StrictModel

__all__ = ["CacheOverride", "TimeoutsOverride"]


class CacheOverride(StrictModel):
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


class TimeoutsOverride(StrictModel):
    """Upstream timeouts in seconds; anything left out is inherited (defaults < tier < rule)."""

    connect_s: float | None = Field(None, gt=0)
    first_byte_s: float | None = Field(None, gt=0)
    between_chunks_s: float | None = Field(None, gt=0)
    total_s: float | None = Field(None, gt=0)
    queue_s: float | None = Field(None, ge=0)
