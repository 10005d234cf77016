"""What dispatch needs from a tier's pool of backends, whichever kind it is.

Edge pools (`gateway.pools.edge`) and cloud pools (`gateway.pools.cloud`) both implement `Pool`;
every backend speaks the OpenAI HTTP API, so an `Endpoint` is just a base URL and a model.

Tested in `tests/gateway/pools/test_cloud.py`, `tests/gateway/pools/test_prefix_memory.py`,
`tests/gateway/pools/test_selection.py` and others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tiergate.core.types import Features
    from tiergate.core.wire import ParsedRequest

__all__ = ["Endpoint", "Pool", "context_mismatch"]


@dataclass(eq=False, slots=True)
class Endpoint:
    """One OpenAI-compatible backend server (an edge node or a vLLM server)."""

    id: str
    base_url: str  # without the trailing /v1, e.g. "http://127.0.0.1:8081"
    model: str  # the model name the backend serves; sent upstream as `model`
    tier: str
    slots: int = 1  # requests it can decode at once (edge: --parallel; vLLM: max_num_seqs)
    inflight: int = 0  # requests this gateway process has open on it right now
    reported_load: float = 0.0  # the backend's own load reading in [0, 1+] (heartbeat or /metrics)
    extra: dict[str, object] = field(default_factory=dict)
    # Requests waiting on this backend before their answer began (see `declare_lost`), each a callback.
    waiting: set[Callable[[str], None]] = field(default_factory=set, repr=False)
    # Headers every request to this backend carries: its API key (`Authorization: Bearer ...`), per node or per tier
    # (gateway.pools.access). Never in a repr: endpoints are logged.
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def load(self) -> float:
        """Estimated busy fraction: the larger of our own in-flight count and the backend's reading."""
        return max(self.inflight / max(self.slots, 1), self.reported_load)

    def declare_lost(self, reason: str) -> None:
        """The pool's health check found this backend unreachable or hung: tell every request waiting on it.

        Dispatch registers a callback in `waiting` while a request waits for a backend's answer to begin (the
        headers of a JSON answer, which come only once it is generated; a stream's first token), and retries
        elsewhere when it is called. Answers that have begun are not touched, and a draining backend is not
        lost: it finishes what it holds.
        """
        for notify in list(self.waiting):
            notify(reason)


def context_mismatch(endpoint: Endpoint, tier_max_context: int | None, ctx: object) -> str | None:
    """Record a backend's context per request (`extra["ctx"]`: a heartbeat's `ctx`, vLLM's `max_model_len`); the
    warning to log when it is new and smaller than what the tier's policy promises, else None."""
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx <= 0 or endpoint.extra.get("ctx") == ctx:
        return None
    endpoint.extra["ctx"] = ctx
    if tier_max_context is None or ctx >= tier_max_context:
        return None
    return (f"tier `{endpoint.tier}` promises max_context {tier_max_context} tokens but {endpoint.base_url} serves "
            f"{ctx} per request: longer prompts will be refused with context_length_exceeded")


@runtime_checkable
class Pool(Protocol):
    """A tier's backends. `candidates` must be cheap: it runs on every request."""

    tier: str

    def candidates(self, request: ParsedRequest, features: Features) -> list[Endpoint]:
        """Healthy endpoints, best first. Dispatch tries them in order until one answers."""
        ...

    def report(self, endpoint: Endpoint, ok: bool, source: str | None = None) -> None:
        """Outcome of one attempt before the first byte, for health and circuit breaking; `source`: the tenant whose
        request it was (a pool takes an endpoint out of rotation only on failures from more than one)."""
        ...

    def healthy(self) -> bool:
        """True when at least one endpoint can take traffic (drives /readyz)."""
        ...

    def endpoints(self) -> list[Endpoint]:
        """All known endpoints, healthy or not (for /v1/models, the status page and metrics)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
