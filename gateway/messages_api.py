"""Anthropic's Messages API (`POST /v1/messages`) as a chat-completions request, and its answer back.

The request is decoded into typed structs (a wrong field is a 400 naming it, in Anthropic's error format) and
written as the chat body the pipeline serves (`gateway.surface`): `system` becomes the first message, `tool_use`
blocks an assistant's `tool_calls`, `tool_result` blocks `tool` messages (before the user's other blocks, as chat
orders them), `tools` with `input_schema` function tools, `tool_choice` auto/any/tool/none auto/required/a named
function/none, `stop_sequences` `stop`, `metadata.user_id` `user`. What the gateway cannot do (server tools such as
web search, documents, MCP servers) is a 400 naming it. `thinking` is accepted and ignored: the tiers here do not
reason, and an answer without thinking blocks is a valid answer to a request that allowed them.

The answer: a chat completion becomes a `message` with text and `tool_use` blocks; a chat stream becomes
Anthropic's events (message_start, content_block_start/delta/stop with text_delta and input_json_delta,
message_delta with the stop reason and usage, message_stop). The stream asks the pipeline for usage
(`stream_options.include_usage`) so `message_delta` carries the tokens the tier counted; `message_start` carries
the gateway's own count of the prompt (the tier counts it only as it answers).

Tested in `tests/gateway/test_messages_api.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from tiergate.core.errors import OpenAIError, from_validation
from tiergate.core.wire import decode_json
from tiergate.gateway.params import MAX_TOP_K
from tiergate.gateway.surface import new_id, sse_event, streamed

__all__ = ["MessagesRequest", "MessagesSurface", "anthropic_error", "to_chat"]

# Anthropic's error types by HTTP status (its documented set); any other 4xx is an invalid request, any 5xx an API
# error, so a client's retry logic reads them as Anthropic's own.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
                529: "overloaded_error", 504: "timeout_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                 "content_filter": "refusal"}


def anthropic_error(status: int, error: dict[str, Any]) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}` for an OpenAI error object."""
    kind = _ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return msgspec.json.encode({"type": "error", "error": {"type": kind, "message": str(error.get("message", ""))}})


# Requests are decoded into tagged unions (a block by its `type`, a message by its `role`), so a block a role cannot
# carry is refused while decoding, naming its path, and /openapi.json (generated from these structs) says the same.
class Base64Source(msgspec.Struct, tag_field="type", tag="base64"):
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str


class UrlSource(msgspec.Struct, tag_field="type", tag="url"):
    url: str


class TextBlock(msgspec.Struct, tag_field="type", tag="text"):
    text: str


class ImageBlock(msgspec.Struct, tag_field="type", tag="image"):
    source: Base64Source | UrlSource


class ToolUseBlock(msgspec.Struct, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(msgspec.Struct, tag_field="type", tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag_field="type", tag="thinking"):
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(msgspec.Struct, tag_field="type", tag="redacted_thinking"):
    data: str


_NonEmpty = msgspec.Meta(min_length=1)


class UserMessage(msgspec.Struct, tag_field="role", tag="user"):
    content: str | Annotated[list[TextBlock | ImageBlock | ToolResultBlock], _NonEmpty]


class AssistantMessage(msgspec.Struct, tag_field="role", tag="assistant"):
    content: str | list[TextBlock | ToolUseBlock | ThinkingBlock | RedactedThinkingBlock]


class MessagesTool(msgspec.Struct):
    """A client tool; server tools (`web_search_20250305`, ...) run on Anthropic's servers, not here."""

    name: Annotated[str, _NonEmpty]
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None


class ToolChoiceAuto(msgspec.Struct, tag_field="type", tag="auto"):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(msgspec.Struct, tag_field="type", tag="any"):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(msgspec.Struct, tag_field="type", tag="tool"):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(msgspec.Struct, tag_field="type", tag="none"):
    pass


class MessagesMetadata(msgspec.Struct):
    user_id: str | None = None


class JsonOutputFormat(msgspec.Struct, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct):
    format: JsonOutputFormat | None = None
    effort: str | None = None  # accepted, ignored: the tiers here do not reason


class MessagesRequest(msgspec.Struct, forbid_unknown_fields=True):
    """A Messages request. Fields that tell Anthropic's own service how to run (cache breakpoints, speed, region,
    workspace) are accepted and ignored; any other field is refused, as Anthropic refuses it."""

    model: str
    messages: Annotated[list[UserMessage | AssistantMessage], _NonEmpty]
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0, le=MAX_TOP_K)] | None = None
    tools: list[MessagesTool] | None = None
    tool_choice: ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone | None = None
    metadata: MessagesMetadata | None = None
    output_config: OutputConfig | None = None
    thinking: dict[str, Any] | None = None  # accepted, ignored (see the module's docstring)
    # Server-side context editing (clearing old tool results as the context fills): accepted, not done here, so a
    # conversation that would have needed it gets the gateway's context-length error instead (Claude Code sends it).
    context_management: dict[str, Any] | None = None
    service_tier: str | None = None  # a hint about Anthropic's capacity; the routing policy decides here
    cache_control: dict[str, Any] | None = None
    speed: str | None = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None


_decoder = msgspec.json.Decoder(MessagesRequest)


def _texts(blocks: str | list[TextBlock] | None) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    return "\n".join(b.text for b in blocks)


def _image(block: ImageBlock) -> dict[str, Any]:
    src = block.source
    url = f"data:{src.media_type};base64,{src.data}" if isinstance(src, Base64Source) else src.url
    return {"type": "image_url", "image_url": {"url": url}}


def _user(m: UserMessage) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "user", "content": m.content}]
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            text = _texts(b.content)
            results.append({"role": "tool", "tool_call_id": b.tool_use_id,
                            "content": f"Error: {text}" if b.is_error else text})
        elif isinstance(b, ImageBlock):
            parts.append(_image(b))
        else:
            parts.append({"type": "text", "text": b.text})
    if not parts:  # chat wants the tool results right after the assistant's calls, and the user's text after them
        return results
    plain = all(p["type"] == "text" for p in parts)
    return [*results, {"role": "user", "content": "\n".join(p["text"] for p in parts) if plain else parts}]


def _assistant(m: AssistantMessage) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": "assistant", "content": m.content}]
    text = "".join(b.text for b in m.content if isinstance(b, TextBlock))
    calls = [{"id": b.id, "type": "function",
              "function": {"name": b.name, "arguments": msgspec.json.encode(b.input).decode()}}
             for b in m.content if isinstance(b, ToolUseBlock)]
    # Thinking blocks are an earlier turn's reasoning: nothing a chat model takes back in.
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return [msg]


def _messages(req: MessagesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if system := _texts(req.system):
        out.append({"role": "system", "content": system})
    for m in req.messages:
        out.extend(_user(m) if isinstance(m, UserMessage) else _assistant(m))
    return out


def _tools(req: MessagesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if req.tools:
        tools = []
        for t in req.tools:
            fn: dict[str, Any] = {"name": t.name, "parameters": t.input_schema}
            if t.description:
                fn["description"] = t.description
            tools.append({"type": "function", "function": fn})
        fields["tools"] = tools
    tc = req.tool_choice
    if isinstance(tc, ToolChoiceTool):
        fields["tool_choice"] = {"type": "function", "function": {"name": tc.name}}
    elif tc is not None:
        fields["tool_choice"] = {ToolChoiceAuto: "auto", ToolChoiceAny: "required", ToolChoiceNone: "none"}[type(tc)]
    if tc is not None and not isinstance(tc, ToolChoiceNone) and tc.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    return fields


def to_chat(body: bytes) -> tuple[dict[str, Any], MessagesRequest]:
    """The chat-completions body for a Messages request (an OpenAIError for one it cannot be)."""
    try:
        req = decode_json(_decoder, body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation(exc) from None
    chat: dict[str, Any] = {"model": req.model, "messages": _messages(req), "max_tokens": req.max_tokens,
                            **_tools(req)}
    for name in ("temperature", "top_p", "top_k"):
        if (v := getattr(req, name)) is not None:
            chat[name] = v
    if req.stop_sequences:
        chat["stop"] = req.stop_sequences
    if req.metadata is not None and req.metadata.user_id:
        chat["user"] = req.metadata.user_id
    if req.output_config is not None and req.output_config.format is not None:
        chat["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": req.output_config.format.schema}}
    if req.stream:
        streamed(chat)
    return chat, req


class MessagesSurface:
    """`POST /v1/messages` over the chat pipeline (`gateway.surface.Surface`)."""

    endpoint = "messages"

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return anthropic_error(status, error)

    def translate(self, body: bytes) -> tuple[bytes, _Back]:
        chat, req = to_chat(body)
        return msgspec.json.encode(chat), _Back(req.model)


def _usage(chat: dict[str, Any]) -> dict[str, int]:
    """Anthropic's usage for chat's: the prompt split into what the tier read from its prefix cache and the rest
    (Anthropic's `input_tokens` excludes cache reads), nothing written to a cache the client asked for."""
    prompt = chat.get("prompt_tokens") or 0
    cached = (chat.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0,
            "output_tokens": chat.get("completion_tokens") or 0}


def _arguments(raw: str) -> Any:
    try:
        return msgspec.json.decode(raw or "{}")
    except (msgspec.DecodeError, RecursionError):
        raise OpenAIError(502, "The tier answered with tool arguments that are not JSON.", type="upstream_error",
                          code="upstream_protocol") from None


class _Back:
    """One request's answer in Anthropic's shape; for a stream, the open block and what is yet to be said."""

    def __init__(self, model: str) -> None:
        self._id = new_id("msg_")
        self._model = model
        self._started = False
        self._index = -1  # the open content block, -1 when none
        self._open: str | None = None  # its kind: "text", or the chat tool call's index as "tool:N"
        self._stop: str | None = None
        self._usage = _usage({})

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return anthropic_error(status, error)

    def prompt_tokens(self, count: int) -> None:
        """`message_start` carries the gateway's count; `message_delta` then gives the tier's own."""
        self._usage = {**self._usage, "input_tokens": count}

    def _message(self, content: list[dict[str, Any]], stop: str | None, usage: dict[str, int]) -> dict[str, Any]:
        return {"id": self._id, "type": "message", "role": "assistant", "model": self._model, "content": content,
                "stop_reason": stop, "stop_sequence": None, "usage": usage}

    def answer(self, chat: dict[str, Any]) -> bytes:
        choice = (chat.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        content: list[dict[str, Any]] = []
        if msg.get("content"):
            content.append({"type": "text", "text": msg["content"]})
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            content.append({"type": "tool_use", "id": call.get("id") or new_id("toolu_"),
                            "name": fn.get("name", ""), "input": _arguments(fn.get("arguments", ""))})
        u = chat.get("usage") or {}
        stop = _STOP_REASONS.get(choice.get("finish_reason") or "stop", "end_turn")
        return msgspec.json.encode(self._message(content, stop, _usage(u)))

    # ---- the stream --------------------------------------------------------------------------------------------

    def _begin(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return sse_event("message_start", {"type": "message_start",
                                           "message": self._message([], None, dict(self._usage))})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open_block(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._open = kind
        return out + sse_event("content_block_start", {"type": "content_block_start", "index": self._index,
                                                       "content_block": block})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self._index,
                                                 "delta": delta})

    def chunk(self, chat: dict[str, Any]) -> bytes:
        out = [self._begin()]
        if u := chat.get("usage"):
            self._usage = _usage(u)
        for choice in chat.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if text := delta.get("content"):
                if self._open != "text":
                    out.append(self._open_block("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": text}))
            for call in delta.get("tool_calls") or []:
                kind = f"tool:{call.get('index', 0)}"
                fn = call.get("function") or {}
                if self._open != kind:
                    out.append(self._open_block(kind, {"type": "tool_use", "name": fn.get("name", ""), "input": {},
                                                       "id": call.get("id") or new_id("toolu_")}))
                if args := fn.get("arguments"):
                    out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
            if reason := choice.get("finish_reason"):
                self._stop = _STOP_REASONS.get(reason, "end_turn")
        return b"".join(out)

    def done(self) -> bytes:
        return b"".join([
            self._begin(), self._close(),
            sse_event("message_delta", {"type": "message_delta",
                                        "delta": {"stop_reason": self._stop or "end_turn", "stop_sequence": None},
                                        "usage": self._usage}),
            sse_event("message_stop", {"type": "message_stop"})])

    def stream_error(self, error: dict[str, Any]) -> bytes:
        status = 502 if error.get("type") == "upstream_error" else 500
        return sse_event("error", msgspec.json.decode(anthropic_error(status, error)))
