"""What one cloud tier's pool is told: its servers, how it polls them and how it picks one.

`gateway.tiers` builds a `CloudPoolSettings` from the tier's config; the defaults are the pool's
own when the config says nothing. Tested in `tests/gateway/pools/test_cloud.py` and `tests/gateway/test_tiers.py`.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field

from tiergate.gateway.pools.access import BackendAccess
from tiergate.gateway.pools.selection import Strategy

__all__ = ["CloudPoolSettings"]


@dataclass(frozen=True, slots=True)
class CloudPoolSettings:
    """The settings of a `CloudPool` over vLLM servers from a static list and/or a DNS name.

    `model` is the served model name each server must list in /v1/models (and what dispatch sends
    upstream). `slots` is each server's `max_num_seqs`, the denominator of its load. `max_context` is
    what the tier's policy promises; a server serving less is warned about.
    """

    tier: str
    model: str
    endpoints: tuple[str, ...] = ()
    _: KW_ONLY
    # where the servers are
    dns: str | None = None
    port: int = 8000
    scheme: str = "http"
    dns_interval_s: float = 10.0
    # what each server is
    slots: int = 256
    max_context: int | None = None
    # how a server is picked (gateway.pools.selection)
    strategy: Strategy = "prefix"
    load_bound: float = 1.2
    cached_load_bound: float | None = None
    affinity_chars: int = 256
    # how servers are polled and when one is out
    poll_interval_s: float = 1.0
    poll_timeout_s: float = 2.0
    slow_polls_unhealthy: int = 3
    model_check_every: int = 30
    rate_window_s: float = 60.0
    breaker_threshold: int = 3
    breaker_open_s: float = 10.0
    # the API key the servers require (vLLM --api-key) and the CAs their TLS is verified with
    access: BackendAccess = field(default_factory=BackendAccess)

    def __post_init__(self) -> None:
        if not self.endpoints and not self.dns:
            raise ValueError(f"cloud tier {self.tier!r}: give static endpoints, a DNS name, or both")
