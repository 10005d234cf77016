"""One request inside the edge engine: what the decode loop tracks for it, and the chunks it hands back.

`ActiveRequest` is created by `Engine.submit` on the event loop and then owned by the decode thread (its
slot, prefill progress, sampler, text decoder); only `cancelled` is written from both sides, under the engine's
lock. `Chunk` is what reaches the request's asyncio consumer.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tiergate.edge_node.engine.sampling import SamplerChain, SamplingParams
from tiergate.edge_node.server.logprobs import TokenLogprob
from tiergate.edge_node.server.textstream import TextStream

if TYPE_CHECKING:
    from tiergate.edge_node.engine.slots import Slot

__all__ = ["ActiveRequest", "Chunk", "FinishReason"]

FinishReason = Literal["stop", "length"]


@dataclass(slots=True)
class Chunk:
    """A piece of generated text; the last chunk of a request has `finish_reason` set and final counts."""

    text: str
    finish_reason: FinishReason | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # the tokens behind `text`, when the request asked for them


class ActiveRequest:
    __slots__ = (
        "admitted_at",
        "cached",
        "cancelled",
        "endpoint",
        "first_token_at",
        "logprobs",
        "id",
        "loop",
        "max_new",
        "n_generated",
        "n_prompt_done",
        "next_token",
        "params",
        "prompt",
        "queue",
        "sampler",
        "slot",
        "submitted",
        "text",
    )

    def __init__(self, rid: str, prompt: list[int], params: SamplingParams, max_new: int, endpoint: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.id = rid
        self.prompt = prompt
        self.params = params
        self.max_new = max_new
        self.endpoint = endpoint
        self.loop = loop
        self.queue: asyncio.Queue[Chunk] = asyncio.Queue()
        self.submitted = time.monotonic()
        self.first_token_at: float | None = None
        self.admitted_at: float | None = None  # when it got a slot (its queue wait ends, its prefill begins)
        self.cancelled = False
        self.slot: Slot | None = None
        self.n_prompt_done = 0  # prompt tokens whose KV the slot holds (reused ones included)
        self.sampler: SamplerChain | None = None
        self.text = TextStream(params.stop)
        self.n_generated = 0
        self.next_token = -1
        self.cached = 0  # prompt tokens reused from a slot's cache
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None  # not yet sent

    def take_logprobs(self) -> list[TokenLogprob] | None:
        """The log-probabilities of the tokens since the last chunk (text held back keeps its tokens too)."""
        if self.logprobs is None:
            return None
        out, self.logprobs = self.logprobs, []
        return out

    @property
    def prefilling(self) -> bool:
        return self.n_prompt_done < len(self.prompt)
