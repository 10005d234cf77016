"""The policy's `costs` section: what a token costs on each tier, and the arithmetic of a request's spend.

Prices are per 1,000 tokens, in the policy's `currency`, for prompt, cached-prompt and completion tokens. The
`reference_tier` is what savings are measured against: what the same tokens would have cost had every request gone
there ("all cloud"). A tier with no prices costs nothing (`policy check` warns). See docs/policy.md, "Costs".

Self-hosted tiers (edge nodes) are priced per token here too. Deriving that price from a node's cost per second and
its measured throughput is a later step: `CostsConfig.tier_price` is the one place such a derived price would come
from, so every caller already goes through it.

Tested in `tests/policies/test_costs.py`.
"""

from __future__ import annotations

from pydantic import Field

from tiergate.policies.base import StrictModel

__all__ = ["CostsConfig", "TierPrice", "format_cost", "token_cost"]

class TierPrice(StrictModel):
    """A tier's prices per 1,000 tokens (never negative)."""

    prompt_per_1k: float = Field(0.0, ge=0, allow_inf_nan=False,
                                 description="per 1,000 prompt tokens not served from a prefix cache")
    cached_prompt_per_1k: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="per 1,000 prompt tokens the backend served from its prefix cache "
                                    "(usage.prompt_tokens_details.cached_tokens); default: prompt_per_1k")
    completion_per_1k: float = Field(0.0, ge=0, allow_inf_nan=False, description="per 1,000 completion tokens")

    @property
    def cached_prompt(self) -> float:
        return self.prompt_per_1k if self.cached_prompt_per_1k is None else self.cached_prompt_per_1k


class CostsConfig(StrictModel):
    """Prices per tier, the currency they are in, and the tier savings are measured against."""

    currency: str = Field("USD", pattern=r"^[A-Za-z][A-Za-z0-9_]{0,15}$",
                          description="the unit of every price and of tiergate_spend_total (a metric label)")
    reference_tier: str = Field(description="savings are measured against sending every request here "
                                            "(what the same tokens would have cost on it)")
    prices: dict[str, TierPrice] = Field(default_factory=dict, description="per tier; a tier left out costs 0")

    def tier_price(self, tier: str) -> TierPrice | None:
        """The price of a tier's tokens; None for a tier without prices (and for `cache`, which costs nothing).

        The hook for self-hosted tiers: a price derived from a node's cost per second and its throughput would be
        computed here, not by the callers."""
        return self.prices.get(tier)

    def cost(self, tier: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What these tokens cost on `tier`."""
        return token_cost(self.tier_price(tier), prompt_tokens, completion_tokens, cached_tokens)

    def reference(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What the same tokens would have cost on the reference tier."""
        return self.cost(self.reference_tier, prompt_tokens, completion_tokens, cached_tokens)


def token_cost(price: TierPrice | None, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
    """prompt/1000 · prompt price + cached/1000 · cached price + completion/1000 · completion price, where `cached`
    (at most the prompt) is the part of the prompt a backend served from its prefix cache. No price: 0."""
    if price is None:
        return 0.0
    prompt, completion = max(prompt_tokens, 0), max(completion_tokens, 0)
    cached = min(max(cached_tokens, 0), prompt)
    return ((prompt - cached) * price.prompt_per_1k + cached * price.cached_prompt
            + completion * price.completion_per_1k) / 1000


def format_cost(value: float) -> str:
    """A cost as the `x-tiergate-cost` header gives it: fixed point, 10 decimals (a token at 0.00001 per 1,000
    still shows), trailing zeros kept so the width does not change."""
    return f"{value:.10f}"
