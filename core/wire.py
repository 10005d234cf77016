"""The OpenAI request and response shapes, as typed msgspec structs.

A request body is decoded exactly once, here, into a `ChatRequest` or `CompletionRequest`;
every later layer (classification, policy, cache, dispatch) reads the typed object.
Validation errors carry the JSON path of the offending field so the client knows what to fix.

Tested in `tests/cache/test_keys.py`, `tests/cache/test_semantic.py`, `tests/gateway/pools/test_cloud.py` and
others.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, TypeVar

import msgspec

__all__ = [
    "CONTROLLED_FIELDS",
    "LOGIT_BIAS_MAX",
    "MAX_TOP_LOGPROBS",
    "ChatRequest",
    "CompletionRequest",
    "ContentPart",
    "Message",
    "ParsedRequest",
    "StreamOptions",
    "decode_chat",
    "decode_completion",
    "decode_json",
    "decode_request",
    "encode",
    "raw_fields",
    "refused_field",
    "unknown_fields",
    "unknown_names",
    "upstream_body",
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


# Value limits of the OpenAI API that the structs' types cannot say; the gateway and the edge node both check them.
MAX_TOP_LOGPROBS = 20  # OpenAI's limit, and vLLM's default --max-logprobs
LOGIT_BIAS_MAX = 100.0  # OpenAI's documented range for a bias: [-100, 100]


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

_T = TypeVar("_T")

_chat_decoder = msgspec.json.Decoder(ChatRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_encoder = msgspec.json.Encoder()


def decode_json(decoder: msgspec.json.Decoder[_T], body: bytes) -> _T:
    """`decoder.decode(body)`, raising only msgspec's errors (ValidationError, DecodeError) for any bytes at all.

    msgspec reports two kinds of malformed input with Python's own exceptions: a string (a value or a key) that is
    not UTF-8 as UnicodeDecodeError, and nesting deeper than the stack (free-form fields such as `tools`, nested
    thousands deep) as RecursionError. Both are malformed JSON all the same, and a caller that turns msgspec's
    errors into a 400 must see them as such.
    """
    try:
        return decoder.decode(body)
    except RecursionError:
        raise msgspec.DecodeError("JSON is nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise msgspec.DecodeError(f"JSON is not valid UTF-8: {exc.reason} at byte {exc.start}") from None


def decode_chat(body: bytes) -> ChatRequest:
    """Decode and validate a chat request; raises msgspec.ValidationError / DecodeError."""
    return decode_json(_chat_decoder, body)


def decode_completion(body: bytes) -> CompletionRequest:
    """Decode and validate a text completion request; raises msgspec.ValidationError / DecodeError."""
    return decode_json(_completion_decoder, body)


class _PlainPart(ContentPart, forbid_unknown_fields=True):
    pass


class _PlainMessage(Message, forbid_unknown_fields=True):
    content: str | list[_PlainPart] | None = None  # type: ignore[assignment]  # a narrower struct, for decoding


class _PlainChatRequest(ChatRequest, kw_only=True):
    """A ChatRequest whose messages carry nothing the structs do not model (the top level may)."""

    messages: list[_PlainMessage]  # type: ignore[assignment]  # a narrower struct, for decoding


_plain_chat_decoder = msgspec.json.Decoder(_PlainChatRequest)


def decode_request(body: bytes, kind: str) -> tuple[ParsedRequest, bool]:
    """Decode and validate a request of `kind` ("chat" or "text"); raises msgspec.ValidationError / DecodeError.

    The flag says the request is plain: no message or content part has a field the structs do not model
    (a legacy `function_call`, an `input_audio` part, ...). Such fields reach the backend all the same
    (`upstream_body`), but the cache's key is made of what the structs model, so a request that is not
    plain must not be answered from the cache. Plain requests, the usual ones, are decoded once.
    """
    if kind != "chat":
        return decode_completion(body), True
    try:
        return decode_json(_plain_chat_decoder, body), True
    except msgspec.ValidationError:
        pass  # a field below the top level that the structs do not model, or an invalid request
    return decode_chat(body), False  # raises the request's own error if it is invalid


def encode(obj: Any) -> bytes:
    return _encoder.encode(obj)


_raw_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])
_KNOWN_FIELDS = {"chat": frozenset(ChatRequest.__struct_fields__),
                 "text": frozenset(CompletionRequest.__struct_fields__)}


def raw_fields(body: bytes) -> dict[str, msgspec.Raw]:
    """The top-level fields of an already decoded body, each value still raw JSON (its exact bytes).

    The body the backend receives is built from these (`upstream_body`), not from the struct: whatever the
    structs do not model, at any depth (a message's legacy `function_call`, a content part of a type they do
    not know, a backend's own extension), reaches the backend byte for byte. Under a microsecond per request.
    Raises msgspec.DecodeError for a body the request decoders accepted only because they skipped the field:
    an unknown key that is not UTF-8.
    """
    return decode_json(_raw_fields, body)


def unknown_names(raw: dict[str, msgspec.Raw], kind: str) -> list[str]:
    """The top-level fields the request structs do not model (`reasoning_effort`, `functions`, ...)."""
    known = _KNOWN_FIELDS[kind]
    return [k for k in raw if k not in known]


def unknown_fields(body: bytes, kind: str) -> dict[str, msgspec.Raw]:
    """The top-level fields of an already decoded body that the request structs do not model, still raw.

    New OpenAI parameters (`reasoning_effort`, `parallel_tool_calls`, the legacy `functions`, ...) appear
    faster than any gateway can model them; a backend that understands one must still receive it, so
    these are forwarded untouched rather than silently dropped (except `CONTROLLED_FIELDS`).
    """
    raw = raw_fields(body)
    return {k: raw[k] for k in unknown_names(raw, kind)}


def upstream_body(raw: dict[str, msgspec.Raw], changes: dict[str, Any]) -> bytes:
    """The client's body with the gateway's `changes` applied (a None value removes the field), as JSON."""
    out = dict(raw)
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return _encoder.encode(out)


# Fields outside the OpenAI API that some backends understand and that would override what the gateway controls:
# the length of the answer (the policy's and the tenant's max_tokens caps), how many sequences one request
# decodes (`n` is 1), generating past the natural end, the backend's scheduling (the gateway admits by the
# tenant's priority), or the plumbing between a router and its servers. A request carrying one of them with any
# value but null or the one that changes nothing (each field's backend default, spelled as listed) is refused
# with 400 `unsupported_parameter`: dropping it silently would answer something else than was asked, and
# forwarding it would let any tenant step around the limits. Everything else unmodelled is forwarded.
# field -> (JSON spellings of the values that change nothing besides `null`, why it is refused)
CONTROLLED_FIELDS: dict[str, tuple[tuple[bytes, ...], str]] = {
    "n_predict": ((), "it is llama.cpp's `max_tokens` and would override the gateway's cap; use `max_tokens`"),
    "max_completion_tokens": ((), "a text completion's length is `max_tokens`"),  # chat models it (and caps it)
    "n_cmpl": ((b"1",), "it is llama.cpp's `n`, and one completion per request is supported"),
    "best_of": ((b"1",), "one sequence per request is supported"),
    "use_beam_search": ((b"false",), "one sequence per request is supported"),
    "min_tokens": ((b"0",), "it forces generation past the answer's natural end"),
    "ignore_eos": ((b"false",), "it forces generation past the answer's natural end"),
    "priority": ((b"0",), "the gateway schedules by the API key's priority (lowered with `x-tiergate-priority`)"),
    "id_slot": ((b"-1",), "the backend's slots are scheduled by the gateway"),
    "prompt_logprobs": ((), "it computes log-probabilities at every prompt position"),
    "kv_transfer_params": ((), "it is the plumbing between a router and its vLLM servers"),
}


def refused_field(raw: dict[str, msgspec.Raw], names: list[str]) -> tuple[str, str] | None:
    """The first of the unmodelled `names` that `CONTROLLED_FIELDS` refuses with the value it has, and why."""
    for name in names:
        rule = CONTROLLED_FIELDS.get(name)
        if rule is not None:
            value = bytes(raw[name])
            if value != b"null" and value not in rule[0]:
                return name, rule[1]
    return None
