"""Which vLLM server should take a request: prefix affinity bounded by load, or plain strategies.

Prefix affinity: vLLM keeps the KV blocks of recent prompts (automatic prefix caching), so a
request whose prompt starts like an earlier one prefills faster on the server that saw it.
Requests are keyed by a hash of the first `affinity_chars` characters of their prompt (the
system prompt, or the start of the conversation), and each key ranks the servers by rendezvous
(highest-random-weight) hashing: the same key always prefers the same server, and adding or
removing a server only moves the keys that server wins or loses.

Bounded load: a pure hash sends a hot prefix to one server however busy it gets (the pile-up
NVIDIA Dynamo #737 and vLLM production-stack #1073 report). As in consistent hashing with
bounded loads (Mirrokni et al.), a server is eligible only if, with this request, its load in
requests stays within its capacity ceil(`bound` x its slot share x the total load after placement);
the request goes to the first eligible server in the key's ranking, so a hot prefix spills to its
second-ranked server (which then warms up for it) instead of piling up.

Cached prefixes (`gateway.pools.prefix_memory`): servers that probably still hold the key's prefix in their
KV cache, because they were sent it recently, are tried first, and each may take the request up to
`cached_bound` instead of `bound`: the request costs that server only its uncached suffix. So a hot
prefix stays on the servers that hold it until they are well past their share, and a cold prefix that
spilled once is found again where it was cached, not sent back to its first-ranked server to miss.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tiergate.core.wire import ChatRequest
from tiergate.gateway.pools.prefix_memory import PrefixMemory

if TYPE_CHECKING:
    from tiergate.core.pool import Endpoint
    from tiergate.core.wire import ParsedRequest

__all__ = ["CACHED_BOUND_FACTOR", "STRATEGIES", "Choice", "Selector", "Strategy", "affinity_key", "approx_tokens",
           "rendezvous_order"]

Strategy = Literal["prefix", "round_robin", "least_load"]
CACHED_BOUND_FACTOR = 1.5  # the default cached_bound, x bound (policy: routing.cached_load_bound)
STRATEGIES: tuple[Strategy, ...] = ("prefix", "round_robin", "least_load")

# Reasons, as recorded in tiergate_cloud_selections_total{reason=...}.
# "cached": a server that holds the prefix other than the key's first-ranked one.
Reason = Literal["affinity", "cached", "spill", "no_key", "round_robin", "least_load"]


@dataclass(frozen=True, slots=True)
class Choice:
    order: list[Endpoint]  # best first; dispatch tries them in turn
    reason: Reason


def affinity_key(request: ParsedRequest, chars: int) -> bytes | None:
    """Hash of the first `chars` characters of the prompt as the model will see it; None if empty.

    Chat messages are joined with their roles so that the same words in a system prompt and in a
    user turn do not collide. Shorter prompts hash whole, so exact repeats still share a server.
    """
    if isinstance(request, ChatRequest):
        parts: list[str] = []
        size = 0
        for m in request.messages:
            piece = f"{m.role}\x1f{m.text()}\x1e"
            parts.append(piece)
            size += len(piece)
            if size >= chars:
                break
        text = "".join(parts)[:chars]
    else:
        prompt = request.prompt
        text = (prompt if isinstance(prompt, str) else (prompt[0] if prompt else ""))[:chars]
    if not text:
        return None
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def rendezvous_order(key: bytes, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """Endpoints ranked for `key` by highest random weight (stable per key and endpoint id)."""

    def weight(ep: Endpoint) -> bytes:
        return hashlib.blake2b(key + ep.id.encode(), digest_size=8).digest()

    return sorted(endpoints, key=weight, reverse=True)


def approx_tokens(request: ParsedRequest) -> int:
    """A prompt's size in tokens when the gateway has not counted it (about 4 characters per token)."""
    return max(1, len(request.prompt_text()) // 4)


class Selector:
    """Orders a tier's routable endpoints for one request. Keeps a round-robin counter and the prefix memory.

    (Remembering one home per key and moving it on a spill was tried: with loads fluctuating around
    the bound, homes flip-flopped between servers and fewer requests found their prefix cached. The
    prefix memory instead keeps every server that holds the key, and the ranking breaks ties.)
    """

    def __init__(
        self,
        strategy: Strategy = "prefix",
        *,
        bound: float = 1.2,
        cached_bound: float | None = None,
        affinity_chars: int = 256,
        memory: PrefixMemory | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if bound < 1.0:
            raise ValueError("bound must be >= 1.0 (1.0 means perfectly even load)")
        cached_bound = CACHED_BOUND_FACTOR * bound if cached_bound is None else cached_bound
        if cached_bound < bound:
            raise ValueError("cached_bound must be >= bound (a cached request costs its server less, not more)")
        self.strategy: Strategy = strategy
        self.bound = bound
        self.cached_bound = cached_bound
        self.affinity_chars = affinity_chars
        self.memory = memory if memory is not None else PrefixMemory()
        self._turn = itertools.count()

    def order(self, request: ParsedRequest, endpoints: Sequence[Endpoint], tokens: int | None = None) -> Choice | None:
        """The endpoints best first, with why the first one was chosen; None when there are none.

        `tokens` is the prompt's size (the gateway's count), what the chosen server's cache is charged with.
        """
        if not endpoints:
            return None
        if self.strategy == "round_robin":
            ring = sorted(endpoints, key=lambda ep: ep.id)
            start = next(self._turn) % len(ring)
            return Choice(ring[start:] + ring[:start], "round_robin")
        if self.strategy == "prefix":
            key = affinity_key(request, self.affinity_chars)
            if key is not None:
                choice = self._bounded_affinity(key, endpoints)
                self.memory.record(choice.order[0].id, key, tokens if tokens else approx_tokens(request))
                return choice
        return Choice(self._by_load(endpoints), "least_load" if self.strategy == "least_load" else "no_key")

    def _by_load(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        # Ties (typically all idle) rotate so that equal servers share the work.
        ring = sorted(endpoints, key=lambda ep: ep.id)
        start = next(self._turn) % len(ring)
        rotated = ring[start:] + ring[:start]
        return sorted(rotated, key=lambda ep: ep.load())

    def _bounded_affinity(self, key: bytes, endpoints: Sequence[Endpoint]) -> Choice:
        ranked = rendezvous_order(key, endpoints)
        first = ranked[0]
        held = self.memory.holders(key, ranked)
        if held:  # holders first (in the key's ranking), then the rest of the ranking
            ranked = held + [ep for ep in ranked if ep not in held]
        # Loads in requests (busy fraction x slots) so the bound is the classic integer capacity
        # ceil(c * mean): with a handful of requests per server a fractional bound would force
        # perfect balance and spill so often that affinity disappears.
        units = [ep.load() * max(ep.slots, 1) for ep in ranked]
        total_slots = sum(max(ep.slots, 1) for ep in ranked)
        total = sum(units) + 1.0  # including this request
        chosen: Choice | None = None
        for i, ep in enumerate(ranked):
            bound = self.cached_bound if ep in held else self.bound
            capacity = math.ceil(bound * total * max(ep.slots, 1) / total_slots - 1e-9)
            if units[i] + 1.0 <= capacity + 1e-9:
                rest = [e for e in ranked if e is not ep]
                reason: Reason = "affinity" if ep is first else "cached" if ep in held else "spill"
                chosen = Choice([ep, *sorted(rest, key=lambda e: e.load())], reason)
                break
        if chosen is None:  # fractional readings (KV-cache usage) can leave nobody under the cap
            chosen = Choice(self._by_load(ranked), "spill")
        return chosen
