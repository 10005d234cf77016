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
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from core.pool import Endpoint
    from core.wire import ParsedRequest

__all__ = ["STRATEGIES", "Choice", "Selector", "Strategy", "affinity_key", "rendezvous_order"]

Strategy = Literal["prefix", "round_robin", "least_load"]
STRATEGIES: tuple[Strategy, ...] = ("prefix", "round_robin", "least_load")

# Reasons, as recorded in tiergate_cloud_selections_total{reason=...}.
Reason = Literal["affinity", "spill", "no_key", "round_robin", "least_load"]


@dataclass(frozen=True, slots=True)
class Choice:
    order: list[Endpoint]  # best first; dispatch tries them in turn
    reason: Reason


def affinity_key(request: ParsedRequest, chars: int) -> bytes | None:
    """Hash of the first `chars` characters of the prompt as the model will see it; None if empty.

    Chat messages are joined with their roles so that the same words in a system prompt and in a
    user turn do not collide. Shorter prompts hash whole, so exact repeats still share a server.
    """
    if request.kind == "chat":
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


class Selector:
    """Orders a tier's routable endpoints for one request. Keeps only a round-robin counter.

    (Remembering a home per key and moving it on a spill was tried: with loads fluctuating around
    the bound, homes flip-flopped between servers and fewer requests found their prefix cached.)
    """

    def __init__(
        self,
        strategy: Strategy = "prefix",
        *,
        bound: float = 1.2,
        affinity_chars: int = 256,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; allowed: {', '.join(STRATEGIES)}")
        if bound < 1.0:
            raise ValueError("bound must be >= 1.0 (1.0 means perfectly even load)")
        self.strategy: Strategy = strategy
        self.bound = bound
        self.affinity_chars = affinity_chars
        self._turn = itertools.count()

    def order(self, request: ParsedRequest, endpoints: Sequence[Endpoint]) -> Choice | None:
        """The endpoints best first, with why the first one was chosen; None when there are none."""
        if not endpoints:
            return None
        if self.strategy == "round_robin":
            ring = sorted(endpoints, key=lambda ep: ep.id)
            start = next(self._turn) % len(ring)
            return Choice(ring[start:] + ring[:start], "round_robin")
        if self.strategy == "prefix":
            key = affinity_key(request, self.affinity_chars)
            if key is not None:
                return self._bounded_affinity(key, endpoints)
        return Choice(self._by_load(endpoints), "least_load" if self.strategy == "least_load" else "no_key")

    def _by_load(self, endpoints: Sequence[Endpoint]) -> list[Endpoint]:
        # Ties (typically all idle) rotate so that equal servers share the work.
        ring = sorted(endpoints, key=lambda ep: ep.id)
        start = next(self._turn) % len(ring)
        rotated = ring[start:] + ring[:start]
        return sorted(rotated, key=lambda ep: ep.load())

    def _bounded_affinity(self, key: bytes, endpoints: Sequence[Endpoint]) -> Choice:
        ranked = rendezvous_order(key, endpoints)
        # Loads in requests (busy fraction x slots) so the bound is the classic integer capacity
        # ceil(c * mean): with a handful of requests per server a fractional bound would force
        # perfect balance and spill so often that affinity disappears.
        units = [ep.load() * max(ep.slots, 1) for ep in ranked]
        total_slots = sum(max(ep.slots, 1) for ep in ranked)
        total = sum(units) + 1.0  # including this request
        chosen: Choice | None = None
        for i, ep in enumerate(ranked):
            capacity = math.ceil(self.bound * total * max(ep.slots, 1) / total_slots - 1e-9)
            if units[i] + 1.0 <= capacity + 1e-9:
                rest = [e for e in ranked if e is not ep]
                chosen = Choice([ep, *sorted(rest, key=lambda e: e.load())], "affinity" if i == 0 else "spill")
                break
        if chosen is None:  # fractional readings (KV-cache usage) can leave nobody under the cap
            chosen = Choice(self._by_load(ranked), "spill")
        return chosen
