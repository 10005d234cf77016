"""Reading upstream answers and writing answers in the shape the client asked for.

Upstream JSON is decoded into a minimal struct (only what caching, usage accounting and metrics
need); the bytes themselves are relayed untouched. Cached answers are rendered as a normal
completion object or as SSE chunks, so a hit looks exactly like a fresh answer.

Tested in `tests/gateway/test_errors_render_schemas.py`.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import msgspec

from tiergate.cache.types import CachedAnswer
from tiergate.core.http import DONE, sse
from tiergate.core.wire import decode_json

__all__ = ["AnswerSummary", "StreamAccumulator", "cacheable", "error_text", "render_json", "render_sse", "summarize"]

# Only answers that ended by themselves or at max_tokens are worth replaying; "tool_calls", "content_filter"
# and a missing reason are not.
_CACHEABLE_FINISH = frozenset({"stop", "length"})


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = 0


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_tokens_details: _PromptDetails | None = None

    @property
    def cached_tokens(self) -> int:
        """The prompt tokens the backend served from its prefix cache (priced apart: `policies.costs`)."""
        d = self.prompt_tokens_details
        return (d.cached_tokens or 0) if d is not None else 0


class _Message(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    message: _Message | None = None
    delta: _Message | None = None
    text: str | None = None
    finish_reason: str | None = None


_NULL = msgspec.Raw(b"null")


class _Answer(msgspec.Struct):
    model: str = ""
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: msgspec.Raw = _NULL  # a backend's error object (or string) in an answer or a stream chunk


_answer_decoder = msgspec.json.Decoder(_Answer)
_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class AnswerSummary:
    text: str
    finish_reason: str | None
    model: str
    prompt_tokens: int
    completion_tokens: int
    multi_choice: bool
    error: str | None = None  # the backend answered 200 with an error object: an error, never an answer
    cached_tokens: int = 0  # of the prompt, served from the backend's prefix cache


def summarize(body: bytes) -> AnswerSummary:
    """Summarise a non-streaming upstream answer; raises msgspec errors on a malformed body."""
    a = decode_json(_answer_decoder, body)
    first = a.choices[0] if a.choices else _Choice()
    text = (first.message.content if first.message else first.text) or ""
    u = a.usage or _Usage()
    return AnswerSummary(text, first.finish_reason, a.model, u.prompt_tokens, u.completion_tokens,
                         len(a.choices) > 1, error_text(a.error), u.cached_tokens)


def error_text(raw: msgspec.Raw) -> str | None:
    """What a backend's `error` field says (its message, or the string itself); None when there is none."""
    if raw == _NULL:
        return None
    try:
        err = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return "malformed error"
    if err is None:
        return None
    message = err.get("message") if isinstance(err, dict) else err
    return str(message or "error")[:500]


@dataclass(slots=True)
class StreamAccumulator:
    """Collects a streamed answer chunk by chunk (for the cache and for usage accounting)."""

    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    multi_choice: bool = False
    error: str | None = None  # an error frame came: whatever follows, the stream is not a whole answer

    def feed(self, payload: bytes) -> bool:
        """Record one chunk; returns True when it is a usage-only chunk (no choices)."""
        a = decode_json(_answer_decoder, payload)  # a backend's bytes: any bytes at all
        if self.error is None:
            self.error = error_text(a.error)
        if a.model:
            self.model = a.model
        if a.usage is not None:
            self.prompt_tokens = a.usage.prompt_tokens
            self.completion_tokens = a.usage.completion_tokens
            self.cached_tokens = a.usage.cached_tokens
        if not a.choices:
            return a.usage is not None
        for c in a.choices:
            if c.index != 0:
                self.multi_choice = True
                continue
            piece = c.delta.content if c.delta else c.text
            if piece:
                self.parts.append(piece)
            if c.finish_reason:
                self.finish_reason = c.finish_reason
        return False

    @property
    def text(self) -> str:
        return "".join(self.parts)


def cacheable(a: AnswerSummary | StreamAccumulator, kind: str, tier: str) -> CachedAnswer | None:
    """The answer to store in the cache, or None when it is not one to replay (unfinished, several choices, or a
    backend's error in it)."""
    if a.finish_reason not in _CACHEABLE_FINISH or a.multi_choice or a.error is not None:
        return None
    return CachedAnswer(kind, a.text, a.finish_reason, a.model, tier,  # type: ignore[arg-type]  # kind: chat|text
                        a.prompt_tokens, a.completion_tokens, int(time.time()))


def _ids(kind: str) -> tuple[str, int]:
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return prefix + uuid.uuid4().hex[:24], int(time.time())


def _usage(a: CachedAnswer) -> dict[str, int]:
    return {"prompt_tokens": a.prompt_tokens, "completion_tokens": a.completion_tokens,
            "total_tokens": a.prompt_tokens + a.completion_tokens}


def render_json(a: CachedAnswer) -> bytes:
    """A cached answer as a complete OpenAI response object."""
    rid, created = _ids(a.kind)
    if a.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": a.text}, "finish_reason": a.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": a.text, "logprobs": None, "finish_reason": a.finish_reason}
        obj = "text_completion"
    return _encoder.encode({"id": rid, "object": obj, "created": created, "model": a.model,
                            "choices": [choice], "usage": _usage(a)})


def render_sse(a: CachedAnswer, include_usage: bool, chunk_chars: int = 64, cost: float | None = None) -> list[bytes]:
    """A cached answer as SSE events (split into modest chunks, as a live stream would be), ending in [DONE]; its
    usage chunk (`include_usage`) carries `cost` when given."""
    rid, created = _ids(a.kind)
    obj = "chat.completion.chunk" if a.kind == "chat" else "text_completion"
    out: list[bytes] = []

    def chunk(piece: str | None, finish: str | None, first: bool = False) -> bytes:
        if a.kind == "chat":
            delta: dict[str, str] = {"role": "assistant"} if first else {}
            if piece:
                delta["content"] = piece
            choice: dict[str, object] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish}
        return sse(_encoder.encode({"id": rid, "object": obj, "created": created, "model": a.model,
                                    "choices": [choice]}))

    pieces = [a.text[i:i + chunk_chars] for i in range(0, len(a.text), chunk_chars)] or [""]
    for i, piece in enumerate(pieces):
        out.append(chunk(piece, None, first=i == 0))
    out.append(chunk(None, a.finish_reason))
    if include_usage:
        usage: dict[str, object] = dict(_usage(a))
        if cost is not None:
            usage["cost"] = cost
        out.append(sse(_encoder.encode({"id": rid, "object": obj, "created": created, "model": a.model,
                                        "choices": [], "usage": usage})))
    out.append(DONE)
    return out
