"""OpenAI's Responses API (`POST /v1/responses`) as a chat-completions request, and its answer back.

`input` (a string, or items: messages, `function_call`, `function_call_output`) and `instructions` become chat
messages; function `tools`, `tool_choice`, `parallel_tool_calls`, `text.format` (json_schema, json_object) and
`max_output_tokens` their chat fields. The answer is a `response` object with `message` and `function_call` output
items; a stream is the Responses event sequence (response.created, response.in_progress, output_item.added,
content_part.added, output_text.delta/done, function_call_arguments.delta/done, output_item.done, and
response.completed, or response.incomplete when the answer hit its length).

Stateless: nothing is stored, so `store: true`, `previous_response_id`, `conversation` and `background` are a
400 saying so (a client that sends the whole conversation as `input` loses nothing); answers say `store: false`.
Built-in tools (web search, file search, code interpreter, ...) run on OpenAI's servers and are a 400 as well.
Errors keep the OpenAI error format, which the Responses API shares.

Tested in `tests/gateway/test_responses_api.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

import msgspec

from tiergate.core.errors import bad_request, from_validation
from tiergate.core.wire import decode_json
from tiergate.gateway.surface import new_id, sse_event, streamed

__all__ = ["ResponsesRequest", "ResponsesSurface", "to_chat"]


class ResponsesPart(msgspec.Struct):
    type: str
    text: str | None = None
    image_url: str | None = None


class ResponsesItem(msgspec.Struct):
    type: str | None = None  # a message may leave it out
    role: Literal["user", "assistant", "system", "developer"] | None = None
    content: str | list[ResponsesPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[ResponsesPart] | None = None
    id: str | None = None
    status: str | None = None


class ResponsesTool(msgspec.Struct):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesFormat(msgspec.Struct):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    description: str | None = None
    strict: bool | None = None


class ResponsesText(msgspec.Struct):
    format: ResponsesFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    input: str | list[ResponsesItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: ResponsesText | None = None
    max_output_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    background: bool | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    truncation: Literal["auto", "disabled"] | None = None
    stream_options: dict[str, Any] | None = None


_decoder = msgspec.json.Decoder(ResponsesRequest)
_STATELESS = "this gateway keeps no responses: send the whole conversation as `input`"


def _part(p: ResponsesPart, where: str) -> dict[str, Any]:
    if p.type in ("input_text", "output_text", "text"):
        return {"type": "text", "text": p.text or ""}
    if p.type == "input_image" and p.image_url is not None:
        return {"type": "image_url", "image_url": {"url": p.image_url}}
    raise bad_request(f"A `{p.type}` content part is not supported through this gateway.", code="unsupported_value",
                      param=where)


def _content(c: str | list[ResponsesPart] | None, where: str) -> str | list[dict[str, Any]]:
    if c is None or isinstance(c, str):
        return c or ""
    parts = [_part(p, where) for p in c]
    return "\n".join(p["text"] for p in parts) if all(p["type"] == "text" for p in parts) else parts


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        out.append({"role": "user", "content": req.input})
        return out
    for i, item in enumerate(req.input):
        where = f"input[{i}]"
        kind = item.type or "message"
        if kind == "message":
            if item.role is None:
                raise bad_request("A message item needs a `role`.", param=f"{where}.role")
            out.append({"role": item.role, "content": _content(item.content, f"{where}.content")})
        elif kind == "function_call":
            if not item.call_id or not item.name:
                raise bad_request("A `function_call` item needs a `call_id` and a `name`.", param=where)
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments or "{}"}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not item.call_id:
                raise bad_request("A `function_call_output` item needs a `call_id`.", param=f"{where}.call_id")
            output = _content(item.output, f"{where}.output")
            if not isinstance(output, str):  # a chat tool message carries text only
                raise bad_request("A `function_call_output` may hold text only, not images.",
                                  code="unsupported_value", param=f"{where}.output")
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        elif kind == "reasoning":
            continue  # an earlier turn's reasoning summary: nothing a chat model takes back in
        elif kind == "item_reference":
            raise bad_request(f"`item_reference` items are not supported: {_STATELESS}.", code="unsupported_value",
                              param=where)
        else:
            raise bad_request(f"An input item of type `{kind}` is not supported through this gateway.",
                              code="unsupported_value", param=f"{where}.type")
    return out


def _tools(req: ResponsesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if req.tools:
        tools = []
        for i, t in enumerate(req.tools):
            if t.type != "function":
                raise bad_request(f"The built-in tool `{t.type}` is not offered by this gateway; only `function` "
                                  "tools are.", code="unsupported_value", param=f"tools[{i}].type")
            if not t.name:
                raise bad_request("A function tool needs a `name`.", param=f"tools[{i}].name")
            fn: dict[str, Any] = {"name": t.name, "parameters": t.parameters or {"type": "object"}}
            if t.description:
                fn["description"] = t.description
            if t.strict is not None:
                fn["strict"] = t.strict
            tools.append({"type": "function", "function": fn})
        fields["tools"] = tools
    tc = req.tool_choice
    if isinstance(tc, str):
        if tc not in ("auto", "none", "required"):
            raise bad_request("`tool_choice` must be \"auto\", \"none\", \"required\" or a function.",
                              param="tool_choice")
        fields["tool_choice"] = tc
    elif tc is not None:
        if tc.get("type") != "function" or not isinstance(tc.get("name"), str):
            raise bad_request("`tool_choice` may name a function (`{\"type\": \"function\", \"name\": ...}`); "
                              f"`{tc.get('type')}` is not supported through this gateway.", code="unsupported_value",
                              param="tool_choice")
        fields["tool_choice"] = {"type": "function", "function": {"name": tc["name"]}}
    if req.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = req.parallel_tool_calls
    return fields


def _format(req: ResponsesRequest) -> dict[str, Any] | None:
    f = req.text.format if req.text is not None else None
    if f is None or f.type == "text":
        return None
    if f.type == "json_object":
        return {"type": "json_object"}
    if not f.name or f.schema is None:
        raise bad_request("A `json_schema` format needs a `name` and a `schema`.", param="text.format")
    js: dict[str, Any] = {"name": f.name, "schema": f.schema}
    if f.strict is not None:
        js["strict"] = f.strict
    if f.description:
        js["description"] = f.description
    return {"type": "json_schema", "json_schema": js}


def to_chat(body: bytes) -> tuple[dict[str, Any], ResponsesRequest]:
    """The chat-completions body for a Responses request (an OpenAIError for one it cannot be)."""
    try:
        req = decode_json(_decoder, body)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise from_validation(exc) from None
    if req.store:
        raise bad_request(f"`store: true` is not supported: {_STATELESS}.", code="unsupported_value", param="store")
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name) is not None:
            raise bad_request(f"`{name}` is not supported: {_STATELESS}.", code="unsupported_parameter", param=name)
    if req.background:
        raise bad_request("`background: true` is not supported: answers are given while the request is open.",
                          code="unsupported_value", param="background")
    if req.reasoning and any(v is not None for v in req.reasoning.values()):
        raise bad_request("`reasoning` is not supported: the tiers behind this gateway are not reasoning models.",
                          code="unsupported_parameter", param="reasoning")
    chat: dict[str, Any] = {"model": req.model, "messages": _messages(req), **_tools(req)}
    if not chat["messages"]:
        raise bad_request("`input` must contain at least one item.", param="input")
    if req.max_output_tokens is not None:
        chat["max_tokens"] = req.max_output_tokens
    for name in ("temperature", "top_p"):
        if (v := getattr(req, name)) is not None:
            chat[name] = v
    if (fmt := _format(req)) is not None:
        chat["response_format"] = fmt
    if user := req.safety_identifier or req.user:
        chat["user"] = user
    if req.stream:
        streamed(chat)
    return chat, req


class ResponsesSurface:
    """`POST /v1/responses` over the chat pipeline (`gateway.surface.Surface`)."""

    endpoint = "responses"

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return msgspec.json.encode({"error": error})

    def translate(self, body: bytes) -> tuple[bytes, _Back]:
        chat, req = to_chat(body)
        return msgspec.json.encode(chat), _Back(req)


class _Back:
    """One request's answer as a `response` object; for a stream, the output items as they are being written."""

    def __init__(self, req: ResponsesRequest) -> None:
        self._req = req
        self._id = new_id("resp_")
        self._created = int(time.time())
        self._model = req.model
        self._seq = 0
        self._started = False
        self._items: list[dict[str, Any]] = []  # the output so far
        self._open: str | None = None  # the item being written: "text" or "tool:N" (the chat call's index)
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    def error(self, status: int, error: dict[str, Any]) -> bytes:
        return msgspec.json.encode({"error": error})

    def prompt_tokens(self, count: int) -> None:
        """Unused: a Responses stream gives usage only in its last event, the tier's."""

    def _response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        req = self._req
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self._id, "object": "response", "created_at": self._created, "status": status,
            "model": self._model, "output": output, "usage": usage, "error": None,
            "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": None, "store": False, "temperature": req.temperature, "top_p": req.top_p,
            "tool_choice": req.tool_choice or "auto", "tools": msgspec.to_builtins(req.tools or []),
            "text": {"format": msgspec.to_builtins(fmt) if fmt is not None else {"type": "text"}},
            "truncation": req.truncation or "disabled", "user": req.user,
        }

    @staticmethod
    def _usage_of(u: dict[str, Any]) -> dict[str, Any]:
        prompt, completion = u.get("prompt_tokens", 0), u.get("completion_tokens", 0)
        cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion}

    @staticmethod
    def _status(finish: str | None) -> str:
        return "incomplete" if finish == "length" else "completed"

    def answer(self, chat: dict[str, Any]) -> bytes:
        choice = (chat.get("choices") or [{}])[0]
        msg = choice.get("message") or {}
        output: list[dict[str, Any]] = []
        finish = choice.get("finish_reason")
        if msg.get("content"):
            output.append(_text_item(new_id("msg_"), msg["content"], self._status(finish)))
        for call in msg.get("tool_calls") or []:
            fn = call.get("function") or {}
            output.append({"type": "function_call", "id": new_id("fc_"), "call_id": call.get("id") or new_id("call_"),
                           "name": fn.get("name", ""), "arguments": fn.get("arguments", ""), "status": "completed"})
        usage = self._usage_of(chat.get("usage") or {})
        return msgspec.json.encode(self._response(self._status(finish), output, usage))

    # ---- the stream --------------------------------------------------------------------------------------------

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        self._seq += 1
        return sse_event(name, {"type": name, "sequence_number": self._seq - 1, **data})

    def _begin(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        first = self._response("in_progress", [], None)
        return (self._event("response.created", {"response": first})
                + self._event("response.in_progress", {"response": first}))

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        index = len(self._items) - 1
        item = self._items[index]
        if item["type"] == "message":
            part = item["content"][0]
            item["status"] = "completed"
            out = self._event("response.output_text.done", {"item_id": item["id"], "output_index": index,
                                                            "content_index": 0, "text": part["text"],
                                                            "logprobs": []})
            out += self._event("response.content_part.done", {"item_id": item["id"], "output_index": index,
                                                              "content_index": 0, "part": part})
        else:
            item["status"] = "completed"
            out = self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "arguments": item["arguments"], "name": item["name"]})
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _add(self, kind: str, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._open = kind
        self._items.append(item)
        return out + self._event("response.output_item.added", {"output_index": len(self._items) - 1,
                                                                "item": dict(item)})

    def chunk(self, chat: dict[str, Any]) -> bytes:
        out = [self._begin()]
        if u := chat.get("usage"):
            self._usage = self._usage_of(u)
        for choice in chat.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if text := delta.get("content"):
                if self._open != "text":
                    item = _text_item(new_id("msg_"), "", "in_progress")
                    out.append(self._add("text", item))
                    out.append(self._event("response.content_part.added", {
                        "item_id": item["id"], "output_index": len(self._items) - 1, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}))
                item = self._items[-1]
                item["content"][0]["text"] += text
                out.append(self._event("response.output_text.delta", {
                    "item_id": item["id"], "output_index": len(self._items) - 1, "content_index": 0,
                    "delta": text, "logprobs": []}))
            for call in delta.get("tool_calls") or []:
                kind = f"tool:{call.get('index', 0)}"
                fn = call.get("function") or {}
                if self._open != kind:
                    out.append(self._add(kind, {"type": "function_call", "id": new_id("fc_"),
                                                "call_id": call.get("id") or new_id("call_"),
                                                "name": fn.get("name", ""), "arguments": "",
                                                "status": "in_progress"}))
                if args := fn.get("arguments"):
                    item = self._items[-1]
                    item["arguments"] += args
                    out.append(self._event("response.function_call_arguments.delta", {
                        "item_id": item["id"], "output_index": len(self._items) - 1, "delta": args}))
            if reason := choice.get("finish_reason"):
                self._finish = reason
        return b"".join(out)

    def done(self) -> bytes:
        status = self._status(self._finish)
        final = self._response(status, self._items, self._usage)
        return self._begin() + self._close() + self._event(f"response.{status}", {"response": final})

    def stream_error(self, error: dict[str, Any]) -> bytes:
        return self._begin() + self._event("error", {"code": error.get("code"), "message": error.get("message", ""),
                                                     "param": error.get("param")})


def _text_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}
