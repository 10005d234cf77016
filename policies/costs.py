"""The policy's `costs` section: what a token costs on each tier, and the arithmetic of a request's spend.

Prices are per 1,000 tokens, in the policy's `currency`, for prompt, cached-prompt and completion tokens. The
`reference_tier` is what savings are measured against: what the same tokens would have cost had every request gone
there ("all cloud"). A tier with no prices costs nothing (`policy check` warns). See docs/policy.md, "Costs".

A self-hosted tier (edge nodes) may instead give `node`: what one node costs per second (power, depreciation, the
GPU's rent) and a benchmark figure for how many tokens it generates per second. Its price per completion token is
then the one divided by the other: a node's second buys that many tokens, whatever they were for (the
throughput a node reports is generated tokens over wall time, prompt processing included, so prompt tokens cost
nothing on top). With `throughput: live` the figure is the tier's nodes' own, read from their heartbeats (the
`tokens_per_second` their /metrics expose, averaged over the nodes that generated anything in their last window);
until a node has reported one the benchmark stands in. `CostsConfig.tier_price` is the one place a derived price
comes from; `basis` says which figure it used (`policy check`, the status page).

Tested in `tests/policies/test_costs.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from enum import StrEnum

from pydantic import Field, PrivateAttr, model_validator

from tiergate.policies.base import StrictModel

__all__ = ["CostsConfig", "NodeTime", "PriceBasis", "Throughput", "TierPrice", "format_cost", "token_cost"]

LiveThroughput = Callable[[str], float | None]  # tier -> its nodes' mean generated tokens/s now (None: no reading)


class Throughput(StrEnum):
    """Where a node-priced tier's tokens per second come from."""

    BENCHMARK = "benchmark"  # the policy's `tokens_per_s`, always
    LIVE = "live"  # the nodes' own reports; the benchmark until one arrives


class PriceBasis(StrEnum):
    """Which figure a tier's price per token came from."""

    TOKENS = "tokens"  # the policy's own per-token prices
    BENCHMARK = "benchmark"  # node cost per second / the policy's tokens_per_s
    LIVE = "live"  # node cost per second / the nodes' measured tokens per second
    BENCHMARK_NO_READING = "benchmark (no live reading yet)"


class NodeTime(StrictModel):
    """A self-hosted tier priced by the time of its nodes rather than per token."""

    per_second: float = Field(gt=0, allow_inf_nan=False, description="what one node (or GPU) costs per second")
    tokens_per_s: float = Field(gt=0, allow_inf_nan=False,
                                description="generated tokens per second of one node, from a benchmark; with "
                                            "throughput: live, used until the nodes report their own")
    throughput: Throughput = Field(Throughput.BENCHMARK, description="benchmark: always tokens_per_s; live: the "
                                   "tier's nodes' measured tokens per second (from their heartbeats)")

    def price(self, tokens_per_s: float) -> TierPrice:
        """Per 1,000 completion tokens: the seconds a node takes for them times its cost per second."""
        return TierPrice.model_construct(prompt_per_1k=0.0, cached_prompt_per_1k=None,
                                         completion_per_1k=self.per_second / tokens_per_s * 1000, node=None)

class TierPrice(StrictModel):
    """A tier's prices per 1,000 tokens (never negative)."""

    prompt_per_1k: float = Field(0.0, ge=0, allow_inf_nan=False,
                                 description="per 1,000 prompt tokens not served from a prefix cache")
    cached_prompt_per_1k: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="per 1,000 prompt tokens the backend served from its prefix cache "
                                    "(usage.prompt_tokens_details.cached_tokens); default: prompt_per_1k")
    completion_per_1k: float = Field(0.0, ge=0, allow_inf_nan=False, description="per 1,000 completion tokens")
    node: NodeTime | None = Field(None, description="instead of token prices: a node's cost per second and its "
                                                    "throughput, from which the price per token is derived")

    @model_validator(mode="after")
    def _one_way(self) -> TierPrice:
        if self.node is not None and (self.prompt_per_1k or self.cached_prompt_per_1k is not None
                                      or self.completion_per_1k):
            raise ValueError("give either per-token prices or `node` (cost per second and throughput), not both")
        return self

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
    embeddings_per_1k: float = Field(0.0, ge=0, allow_inf_nan=False,
                                     description="per 1,000 input tokens of `/v1/embeddings` (the gateway's own "
                                                 "embedder: the CPU it takes); 0 counts them without a price")
    _live: LiveThroughput | None = PrivateAttr(None)
    _derived: dict[str, tuple[float, TierPrice]] = PrivateAttr(default_factory=dict)

    def read_live_throughput(self, live: LiveThroughput) -> None:
        """Where `throughput: live` tiers read their nodes' tokens per second (the gateway binds its edge pools)."""
        self._live = live

    def throughput(self, tier: str) -> tuple[float, PriceBasis] | None:
        """The tokens per second a node-priced tier's price is derived from now, and which figure that is; None
        for a tier priced per token (or not at all)."""
        price = self.prices.get(tier)
        if price is None or price.node is None:
            return None
        node = price.node
        if node.throughput is Throughput.BENCHMARK:
            return node.tokens_per_s, PriceBasis.BENCHMARK
        measured = self._live(tier) if self._live is not None else None
        if measured is None or not math.isfinite(measured) or measured <= 0:
            return node.tokens_per_s, PriceBasis.BENCHMARK_NO_READING
        return measured, PriceBasis.LIVE

    def basis(self, tier: str) -> PriceBasis | None:
        """Which figure `tier_price(tier)` comes from; None for a tier without prices."""
        if tier not in self.prices:
            return None
        found = self.throughput(tier)
        return PriceBasis.TOKENS if found is None else found[1]

    def tier_price(self, tier: str) -> TierPrice | None:
        """The price of a tier's tokens; None for a tier without prices (and for `cache`, which costs nothing).

        A node-priced tier's is derived here from its cost per second and its throughput (the same figure
        priced the same way is computed once), so no caller knows the difference."""
        price = self.prices.get(tier)
        if price is None or price.node is None:
            return price
        tps, _ = self.throughput(tier) or (price.node.tokens_per_s, PriceBasis.BENCHMARK)
        known = self._derived.get(tier)
        if known is None or known[0] != tps:
            known = self._derived[tier] = (tps, price.node.price(tps))
        return known[1]

    def cost(self, tier: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What these tokens cost on `tier`."""
        return token_cost(self.tier_price(tier), prompt_tokens, completion_tokens, cached_tokens)

    def embedding(self, tokens: int) -> float:
        """What embedding `tokens` input tokens costs. The same work whatever the routing, so it saves nothing:
        its reference price is this price."""
        return max(tokens, 0) * self.embeddings_per_1k / 1000

    def reference(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
        """What the same tokens would have cost on the reference tier."""
        return self.cost(self.reference_tier, prompt_tokens, completion_tokens, cached_tokens)


def token_cost(price: TierPrice | None, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> float:
    """prompt/1000 · prompt price + cached/1000 · cached price + completion/1000 · completion price, where `cached`
    (at most the prompt) is the part of the prompt a backend served from its prefix cache. No price: 0."""
    if price is None:
        return 0.0
    # conditionals rather than max/min: this runs several times on every priced request
    prompt = prompt_tokens if prompt_tokens > 0 else 0
    completion = completion_tokens if completion_tokens > 0 else 0
    cached = 0 if cached_tokens <= 0 else prompt if cached_tokens > prompt else cached_tokens
    return ((prompt - cached) * price.prompt_per_1k + cached * price.cached_prompt
            + completion * price.completion_per_1k) / 1000


def format_cost(value: float) -> str:
    """A cost as the `x-tiergate-cost` header gives it: fixed point, 10 decimals (a token at 0.00001 per 1,000
    still shows), trailing zeros kept so the width does not change."""
    return f"{value:.10f}"
