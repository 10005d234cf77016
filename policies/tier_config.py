"""A tier of the policy: a pool of OpenAI-compatible backends serving one model; where its backends are (static
endpoints or DNS discovery), how a request picks one of them (cloud tiers), and its queue when it is full."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from tiergate.policies.base import StrictModel
from tiergate.policies.overrides import TimeoutsOverride

__all__ = ["DiscoveryConfig", "QueueConfig", "RoutingConfig", "TierConfig"]


class QueueConfig(StrictModel):
    """Requests waiting for a free slot when the tier is at max_concurrency (highest priority first)."""

    max_waiting: int = Field(64, ge=0, description="beyond this many waiting requests, shed with 429/503")
    max_wait_s: float | None = Field(
        None, ge=0, le=3600, description="longest wait before shedding or overflowing; default: timeouts.queue_s"
    )


class DiscoveryConfig(StrictModel):
    """Find backends by resolving a DNS name (e.g. a Kubernetes headless service) to all its addresses."""

    dns: str = Field(pattern=r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
    port: int = Field(ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(10.0, gt=0, description="seconds between resolutions")


class RoutingConfig(StrictModel):
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


class TierConfig(StrictModel):
    """A pool of OpenAI-compatible backends serving one model."""

    name: str = Field("", description="filled in from the key under `tiers`")
    kind: Literal["edge", "cloud"]
    model: str = Field(min_length=1, description="public model name listed by /v1/models")
    served_model: str | None = Field(
        None, description="model name the backends serve (vLLM --served-model-name); default: `model`")
    description: str = ""
    endpoints: list[str] = Field(default_factory=list, description="static base URLs, without /v1")
    api_key_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable on the gateway holding the API key its backends require (vLLM "
                    "--api-key / VLLM_API_KEY, edge-node --api-key), sent as `Authorization: Bearer`; edge nodes "
                    "registered with their own node key are sent their own key instead")
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
