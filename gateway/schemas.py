"""The OpenAI request and response shapes, as typed msgspec structs.

A request body is decoded exactly once, here, into a `ChatRequest` or `CompletionRequest`;
every later layer (classification, policy, cache, dispatch) reads the typed object.
Validation errors carry the JSON path of the offending field so the client knows what to fix.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "Message",
    "ParsedRequest",
    "StreamOptions",
    "decode_chat",
    "decode_completion",
    "encode",
    "unknown_fields",
    "with_fields",
]


class ContentPart(msgspec.Struct, omit_defaults=True):
    type: str
    text: str | None = None
    image_url: dict[str, Any] | None = None


class Message(msgspec.Struct, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The message's text: plain content, or its text parts joined."""
        c = self.content
        if c is None:
            return ""
        if isinstance(c, str):
            return c
        return "\n".join(p.text for p in c if p.text)


class StreamOptions(msgspec.Struct, omit_defaults=True):
    include_usage: bool = False


class _Sampling(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Generation parameters shared by both endpoints (all optional, OpenAI defaults apply upstream)."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = None
    user: str | None = None
    # Common extensions understood by vLLM and llama.cpp servers.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None


class ChatRequest(_Sampling, kw_only=True):
    messages: list[Message]
    max_completion_tokens: int | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    kind: ClassVar[str] = "chat"  # not a field: lets code switch on the request type cheaply

    def prompt_text(self) -> str:
        """All message text in order, one message per line: what is classified and embedded."""
        return "\n".join(m.text() for m in self.messages)

    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[str]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    kind: ClassVar[str] = "text"

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else "\n".join(self.prompt)

    def effective_max_tokens(self) -> int | None:
        return self.max_tokens


ParsedRequest = ChatRequest | CompletionRequest

_chat_decoder = msgspec.json.Decoder(ChatRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_encoder = msgspec.json.Encoder()


def decode_chat(body: bytes) -> ChatRequest:
    """Decode and validate a chat request; raises msgspec.ValidationError / DecodeError."""
    try:
        return _chat_decoder.decode(body)
    except RecursionError:  # free-form fields (tools, response_format) nested thousands deep
        raise msgspec.DecodeError("JSON is nested too deeply") from None


def decode_completion(body: bytes) -> CompletionRequest:
    try:
        return _completion_decoder.decode(body)
    except RecursionError:
        raise msgspec.DecodeError("JSON is nested too deeply") from None


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


_raw_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_KNOWN_FIELDS = {"chat": frozenset(ChatRequest.__struct_fields__),
                 "text": frozenset(CompletionRequest.__struct_fields__)}


def unknown_fields(body: bytes, kind: str) -> dict[str, msgspec.Raw]:
    """The top-level fields of an already decoded body that the request structs do not model, still raw.

    New OpenAI parameters (`reasoning_effort`, `parallel_tool_calls`, the legacy `functions`, ...) appear
    faster than any gateway can model them; a backend that understands one must still receive it, so
    these are forwarded untouched rather than silently dropped. Costs under a microsecond per request.
    """
    known = _KNOWN_FIELDS[kind]
    return {k: v for k, v in _raw_fields.decode(body).items() if k not in known}


def with_fields(encoded: bytes, extra: dict[str, msgspec.Raw]) -> bytes:
    """Add raw fields to an encoded JSON object (a request struct always encodes at least `model`)."""
    if not extra:
        return encoded
    return encoded[:-1] + b"," + _encoder.encode(extra)[1:]
