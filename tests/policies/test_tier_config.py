"""policies/tier_config: a tier's endpoints are normalised base URLs, its cloud routing bounds are ordered, and
what is left out takes its default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tiergate.policies.tier_config import RoutingConfig, TierConfig


def test_endpoints_are_base_urls_without_v1_listed_once() -> None:
    tier = TierConfig(kind="cloud", model="m", endpoints=[" http://10.0.0.5:8000/ ", "https://llm.example/api"])
    assert tier.endpoints == ["http://10.0.0.5:8000", "https://llm.example/api"]
    for bad in (["10.0.0.5:8000"], ["http://10.0.0.5:8000/v1"], ["http://a:1", "http://a:1/"]):
        with pytest.raises(ValidationError):
            TierConfig(kind="cloud", model="m", endpoints=bad)


def test_defaults_of_a_tier() -> None:
    tier = TierConfig(kind="edge", model="m")
    assert (tier.max_context, tier.logprobs, tier.queue.max_waiting, tier.routing) == (8192, True, 64, None)


def test_the_cached_load_bound_is_not_below_the_load_bound() -> None:
    assert RoutingConfig(load_bound=1.5, cached_load_bound=1.5).cached_load_bound == 1.5
    with pytest.raises(ValidationError, match="must be >= load_bound"):
        RoutingConfig(load_bound=1.5, cached_load_bound=1.2)
