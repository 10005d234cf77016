"""What one completion request carries through the gateway: who asked what, what was decided, what happened.

`Arrival` is known from the first byte; `RequestContext` once the policy has decided, and never changes after
that; `Outcome` is the little that is learnt on the way to the answer (the cache's verdict, whether a backend
got the request). Settlement reads all three, and sums the request up as a `Finished` for accounting. `UpstreamBody` is the recipe of what backends are sent: a value
dispatch reads (and marks sent) rather than a closure calling back into the pipeline.

Tested in `tests/gateway/test_settlement.py` and `tests/gateway/test_app.py`.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

import msgspec

from tiergate.cache.keys import RequestKey, Route
from tiergate.cache.types import CacheStatus
from tiergate.core.pool import Endpoint
from tiergate.core.types import Decision, Features
from tiergate.core.wire import ParsedRequest, StreamOptions, upstream_body
from tiergate.gateway.auth import Tenant
from tiergate.gateway.limits import Reservation, TenantSlot, rate_headers
from tiergate.gateway.tiers import Routing, RoutingHold
from tiergate.policies.confidence import CascadeVerdict
from tiergate.policies.model import Policy

__all__ = ["MAX_REQUEST_ID", "Arrival", "Finished", "Held", "Outcome", "RequestContext", "UpstreamBody",
           "safe_request_id"]

_STREAM_OPTIONS = StreamOptions(include_usage=True)
# Fields that change how an answer is delivered or billed, not what a backend does: left out of the fingerprint.
_NOT_FINGERPRINTED = frozenset({"stream", "stream_options", "user", "metadata", "store", "safety_identifier",
                                "prompt_cache_key", "service_tier"})
MAX_REQUEST_ID = 128  # characters of a client's x-request-id the gateway keeps (a UUID is 36)
_CLIENT_ID = re.compile(rf"[A-Za-z0-9._:/+=-]{{1,{MAX_REQUEST_ID}}}")


def safe_request_id(client: str | None) -> str:
    """The request's id: the client's `x-request-id` when it is 1 to `MAX_REQUEST_ID` characters of ASCII letters,
    digits and `._:/+=-` (UUIDs, ULIDs, base64 and `req_...` ids all are), else a fresh one (a UUID4 in hex).

    The id is echoed in the answer's `x-request-id`, sent to the backend, written in every log line and
    distillation record of the request, and keyed on by cache feedback. A client's id that is too long or carries
    anything else (spaces, quotes, control characters, non-ASCII) is replaced whole, never truncated or echoed, so
    no client can inflate or forge what the gateway logs and forwards."""
    if client is not None and _CLIENT_ID.fullmatch(client):
        return client
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request as it arrives: its id (the client's `x-request-id` if it is a safe one, else a new one:
    `safe_request_id`), when, and on which endpoint."""

    request_id: str
    started: float  # perf_counter
    endpoint: str  # "chat" | "completions" | a surface's ("messages", "responses"): metrics' and logs' route name

    @classmethod
    def now(cls, request_id: str | None, kind: str, endpoint: str | None = None) -> Arrival:
        name = endpoint or ("chat" if kind == "chat" else "completions")
        return cls(safe_request_id(request_id), time.perf_counter(), name)


class Held:
    """What an accepted request holds until its answer has ended: its routing version and, once admitted, one of
    its tenant's concurrent slots. Both are given back together, once, by whoever ends the answer."""

    __slots__ = ("routing", "slot", "tokens")

    def __init__(self, routing: RoutingHold) -> None:
        self.routing = routing
        self.slot: TenantSlot | None = None
        self.tokens: Reservation | None = None  # its token budget, settled by its `Settlement`

    def release(self) -> None:
        if self.slot is not None:
            self.slot.release()
        self.routing.release()


@dataclass(frozen=True, slots=True)
class RequestContext:
    """An accepted request once the policy has decided: read-only from then on."""

    arrival: Arrival
    tenant: Tenant
    req: ParsedRequest
    raw: dict[str, msgspec.Raw]  # the body's top-level fields as sent: what the backend gets, amended
    extra: tuple[str, ...]  # names of the top-level fields the structs do not model
    plain: bool  # no field the structs do not model below the top level (see `core.wire.decode_request`)
    features: Features
    decision: Decision
    held: Held  # what the request holds until its answer ends; whoever ends the answer releases it

    @property
    def request_id(self) -> str:
        return self.arrival.request_id

    @property
    def routing(self) -> Routing:
        """The version it was checked, classified and decided under: dispatch and settlement read it too."""
        return self.held.routing.routing

    @property
    def policy(self) -> Policy:
        return self.held.routing.routing.active.policy

    def max_tokens(self) -> int | None:
        """The answer's length as backends are asked for it: the client's, under the policy's and the tenant's cap."""
        asked, cap = self.req.effective_max_tokens(), self.decision.max_tokens_cap
        if cap is None:
            return asked
        return cap if asked is None else min(asked, cap)

    def cache_route(self) -> Route:
        """What of the decision the cache keys on: its tiers and this effective budget (`cache.keys.Route`)."""
        return Route.of(self.decision, self.max_tokens())


class AnswerWaiter(Protocol):
    """Waits for the answer a tier gave the client, to compare the edge's with it (`gateway.agreement`)."""

    def cloud(self, text: str | None, tier: str) -> None:
        """The client's answer, once whole (None: it was not: cut short, several choices, an error)."""
        ...


@dataclass(slots=True)
class Outcome:
    """What the way to the answer finds out: the cache's verdict and whether a backend got the request."""

    cache: CacheStatus = "bypass"  # the x-tiergate-cache header
    cache_key: RequestKey | None = None  # from the lookup, reused by the store
    similarity: float | None = None  # of a semantic hit
    body: UpstreamBody | None = None  # what backends are sent; says whether one was (it may be working on it)
    streaming: bool = False  # a backend's stream is being relayed: it releases what the request holds when it ends
    cascade: CascadeVerdict | None = None  # a cascade's judgment of its first tier's answer
    shadow_check: bool = False  # a cache hit sampled for verification: its request also goes to the tier after it
    stream_cost: bool = True  # a stream's final usage chunk carries `cost` (unless `x-tiergate-cost: off`)
    pair: AnswerWaiter | None = None  # an edge answer the client did not get, to be compared with the one it gets


@dataclass(frozen=True, slots=True)
class Finished:
    """A request once it is over, as accounting counts and logs it (built by its `Settlement`, whichever way it
    ended: what is not known by then, because the request never got that far, is None)."""

    arrival: Arrival
    tier: str  # the tier that answered; "cache" for a cache hit, "none" when no tier did
    status: int  # what the client got (499: it left first)
    overhead: float  # seconds of the gateway's own work
    elapsed: float  # seconds from arrival to the end
    tenant: Tenant | None = None
    decision: Decision | None = None
    features: Features | None = None
    cache: CacheStatus = "bypass"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class _Sent:
    """Shared by a body and its amended copies: whether dispatch posted any of them to a backend."""

    yes: bool = False


@dataclass(slots=True, eq=False)
class UpstreamBody:
    """The request as each backend should see it: its own model name, max_tokens capped, usage asked for.

    Built from the client's own JSON (`raw`), so every field the structs do not model, at any depth, is forwarded
    byte for byte; only `changes` are the gateway's. Dispatch calls `for_endpoint` and then `mark_sent` just
    before it posts, so whoever holds the body knows afterwards whether a backend got the request.
    """

    raw: dict[str, msgspec.Raw]
    changes: dict[str, object]
    max_tokens: int | None  # what backends are asked for (the most a backend may generate)
    _sent: _Sent
    _by_model: dict[str, bytes]

    @classmethod
    def of(cls, ctx: RequestContext, *, as_json: bool = False) -> UpstreamBody:
        """The request's body; `as_json` forces a JSON answer (a shadow check) whatever the client asked for."""
        max_tokens = ctx.max_tokens()
        changes: dict[str, object] = {"model": None, "max_tokens": max_tokens, "max_completion_tokens": None}
        if as_json:
            changes |= {"stream": None, "stream_options": None}
        elif ctx.req.stream:
            changes["stream_options"] = _STREAM_OPTIONS
        return cls(ctx.raw, changes, max_tokens, _Sent(), {})

    def amended(self, extra: dict[str, object]) -> UpstreamBody:
        """The same request with `extra` fields (what a cascade asks its first tier for); sent together."""
        return UpstreamBody(self.raw, self.changes | extra, self.max_tokens, self._sent, {})

    @property
    def sent(self) -> bool:
        return self._sent.yes

    def mark_sent(self) -> None:
        self._sent.yes = True

    def fingerprint(self) -> str:
        """The request as a poison would be recognised again (`gateway.quarantine`): a hash of its body with keys
        sorted and whitespace gone, leaving out the fields that do not change what a backend does with it."""
        fields = {k: v for k, v in self.raw.items() if k not in _NOT_FINGERPRINTED}
        canonical = msgspec.json.encode({k: msgspec.json.decode(v) for k, v in fields.items()}, order="sorted")
        return hashlib.sha256(canonical).hexdigest()

    def for_endpoint(self, ep: Endpoint) -> bytes:
        b = self._by_model.get(ep.model)
        if b is None:
            b = self._by_model[ep.model] = upstream_body(self.raw, self.changes | {"model": ep.model})
        return b


def answer_headers(ctx: RequestContext, outcome: Outcome, tier: str, overhead_s: float | None = None) -> dict[str, str]:
    """The headers of an answer: where it came from, the rule that sent it there, the gateway's own time."""
    h = {"x-request-id": ctx.request_id, "x-tiergate-tier": tier, "x-tiergate-cache": outcome.cache,
         "x-tiergate-rule": ctx.decision.rule, "x-tiergate-prompt-tokens": str(ctx.features.prompt_tokens)}
    if outcome.similarity is not None:  # x-tiergate-similarity: the older name, kept for existing clients
        h["x-tiergate-cache-similarity"] = h["x-tiergate-similarity"] = f"{outcome.similarity:.4f}"
    if outcome.cascade is not None:
        v = outcome.cascade
        h["x-tiergate-cascade"] = "kept" if v.keep else "escalated"
        h["x-tiergate-cascade-reason"] = v.reason
        if v.confidence.tokens:
            h["x-tiergate-confidence"] = f"{v.confidence.mean_logprob:.4f}"
    if overhead_s is not None:
        h["x-tiergate-overhead-ms"] = f"{overhead_s * 1000:.3f}"
    held = ctx.held
    if held.slot is not None and held.slot.requests is not None or held.tokens is not None:
        h |= rate_headers(held.slot.requests if held.slot is not None else None,
                          held.tokens.window if held.tokens is not None else None)
    return h
