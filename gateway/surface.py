"""Another API's shape over the chat pipeline: Anthropic Messages, OpenAI Responses.

A request in another API's shape is translated into a chat-completions body and answered by the very
`CompletionPipeline` that serves `/v1/chat/completions`: authentication, limits, classification, routing, the
cache, dispatch, settlement and metrics are that one path, never a copy of it. The pipeline's answer is translated
back on its way out, at the ASGI level, so what the pipeline owns until the last byte (a stream's close hook, a
background settlement, disconnect detection) runs exactly as it does for chat: a JSON answer whole, a stream event
by event, an error in the surface's own error format.

Tested in `tests/gateway/test_surface.py`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from tiergate.core.errors import OpenAIError
from tiergate.core.http import read_body, replay
from tiergate.core.wire import decode_json
from tiergate.gateway.auth import Authenticator, Tenant
from tiergate.gateway.context import Arrival
from tiergate.gateway.settlement import Settlements

__all__ = ["AnswerTranslator", "ChatHandler", "ErrorFormat", "Surface", "SurfaceEndpoint", "SurfaceLimits",
           "Translated", "authorization", "new_id", "sse_event", "streamed"]

_CHAT_PATH = "/v1/chat/completions"
_any = msgspec.json.Decoder()  # a backend's bytes, any at all (`decode_json` turns every failure into DecodeError)
_SSE = b"text/event-stream"


class ErrorFormat(Protocol):
    """A surface's error body for an OpenAI error object (`{"message", "type", "code", "param"}`)."""

    def error(self, status: int, error: dict[str, Any]) -> bytes: ...


class AnswerTranslator(ErrorFormat, Protocol):
    """One request's way back: a chat answer, or a chat stream chunk by chunk (it keeps the stream's state)."""

    def answer(self, chat: dict[str, Any]) -> bytes: ...

    def prompt_tokens(self, count: int) -> None:
        """The gateway's count of the prompt, known before a stream's first event (`x-tiergate-prompt-tokens`)."""

    def chunk(self, chat: dict[str, Any]) -> bytes: ...

    def done(self) -> bytes: ...

    def stream_error(self, error: dict[str, Any]) -> bytes: ...


class Surface(ErrorFormat, Protocol):
    """An API shape: how its request becomes a chat request (an `OpenAIError` for one it cannot translate).
    `endpoint` is its route's name in metrics and logs."""

    endpoint: str

    def translate(self, body: bytes) -> tuple[bytes, AnswerTranslator]: ...


ChatHandler = Callable[[Request, str, str], Awaitable[Response]]  # `CompletionPipeline.handle`


@dataclass(frozen=True, slots=True)
class SurfaceLimits:
    max_body_bytes: int
    body_timeout_s: float


def authorization(request: Request) -> str | None:
    """The tenant's key as the pipeline reads it: `Authorization`, else Anthropic's `x-api-key` as a bearer key."""
    auth = request.headers.get("authorization")
    if auth:
        return auth
    key = request.headers.get("x-api-key")
    return f"Bearer {key}" if key else None


class SurfaceEndpoint:
    """One route of a surface: translate, run the chat pipeline, translate its answer back."""

    def __init__(self, surface: Surface, chat: ChatHandler, keyring: Authenticator, settlements: Settlements,
                 limits: SurfaceLimits) -> None:
        self._surface = surface
        self._chat = chat
        self._keyring = keyring
        self._settlements = settlements
        self._limits = limits

    async def handle(self, request: Request) -> Response:
        auth = authorization(request)
        tenant: Tenant | None = None
        try:
            tenant = self._keyring.authenticate(auth)  # a bad key is a 401 before the body is even read
            body = await read_body(request, self._limits.max_body_bytes, self._limits.body_timeout_s)
            chat_body, back = self._surface.translate(body)
        except OpenAIError as exc:  # refused before the pipeline: settled (logged, counted) as the pipeline would
            settle = self._settlements.open(Arrival.now(request.headers.get("x-request-id"), "chat",
                                                        self._surface.endpoint))
            refused = await settle.refused(exc, tenant=tenant, decision=None, features=None, cache="bypass")
            return Translated(refused, self._surface, None)
        except ClientDisconnect:
            return Response(status_code=499)
        inner = Request(_chat_scope(request.scope, chat_body, auth), replay(chat_body, request.receive))
        answer = await self._chat(inner, "chat", self._surface.endpoint)
        return Translated(answer, back, back)


def _chat_scope(scope: Scope, body: bytes, auth: str | None) -> Scope:
    """The scope of the translated request: the chat route, its new body's length, the key as a bearer key."""
    drop = {b"content-length", b"authorization", b"x-api-key", b"content-type", b"transfer-encoding"}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in drop]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if auth is not None:
        headers.append((b"authorization", auth.encode("latin-1")))
    return {**scope, "path": _CHAT_PATH, "raw_path": _CHAT_PATH.encode(), "headers": headers}


class Translated(Response):
    """The pipeline's response, sent as the surface's: status and headers kept, the body translated.

    The inner response is run as it is (its background task, its stream's clean-up), only its `send` is wrapped.
    """

    def __init__(self, inner: Response, errors: ErrorFormat, back: AnswerTranslator | None) -> None:
        super().__init__(status_code=inner.status_code)
        self._inner = inner
        self._errors = errors
        self._back = back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._inner(scope, receive, _Rewriter(self._errors, self._back, send).send)


class _Rewriter:
    """Rewrites the messages of one response on their way to the client."""

    def __init__(self, errors: ErrorFormat, back: AnswerTranslator | None, send: Send) -> None:
        self._errors = errors
        self._back = back
        self._send = send
        self._start: Message | None = None
        self._status = 200
        self._stream = False
        self._body: list[bytes] = []
        self._pending = b""
        self._ended = False

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            self._status = message["status"]
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            self._stream = self._status == 200 and ctype.startswith(_SSE) and self._back is not None
            if self._stream:
                assert self._back is not None
                count = dict(message.get("headers", [])).get(b"x-tiergate-prompt-tokens", b"")
                if count.isdigit():
                    self._back.prompt_tokens(int(count))
                await self._send({**message, "headers": _without_length(message.get("headers", []))})
            return
        if kind != "http.response.body":
            await self._send(message)
            return
        data, more = message.get("body", b""), message.get("more_body", False)
        if self._stream:
            out = self._events(data)
            if out or not more:
                await self._send({"type": "http.response.body", "body": out, "more_body": more})
            return
        self._body.append(data)
        if not more:
            body = self._whole(b"".join(self._body))
            assert self._start is not None
            headers = _without_length(self._start.get("headers", []))
            headers.append((b"content-length", str(len(body)).encode()))
            await self._send({**self._start, "status": self._status, "headers": headers})
            await self._send({"type": "http.response.body", "body": body, "more_body": False})

    def _whole(self, body: bytes) -> bytes:
        try:
            obj = decode_json(_any, body)
        except msgspec.DecodeError:
            return body  # not JSON (an empty 499): nothing to translate
        if not isinstance(obj, dict):
            return body
        if self._status != 200 or "error" in obj and obj["error"] is not None:
            err = obj.get("error")
            return self._errors.error(self._status, err if isinstance(err, dict) else {"message": str(err)})
        if self._back is None:
            return body
        try:
            return self._back.answer(obj)
        except OpenAIError as exc:  # an answer the surface cannot say (tool arguments that are not JSON)
            self._status = exc.status
            return self._errors.error(exc.status, exc.body()["error"])

    def _events(self, data: bytes) -> bytes:
        """The surface's events for every whole SSE event in `data` (a partial one waits for the next chunk)."""
        buf = self._pending + data
        *whole, self._pending = buf.split(b"\n\n")
        out: list[bytes] = []
        back = self._back
        assert back is not None  # a stream is only rewritten for a request that has a way back
        for event in whole:
            if self._ended:
                break
            for line in event.split(b"\n"):
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:]
                if payload == b"[DONE]":
                    out.append(back.done())
                    self._ended = True
                    break
                try:
                    obj = decode_json(_any, payload)
                except msgspec.DecodeError:
                    continue  # a backend's unreadable chunk: nothing a client of this surface could use
                if isinstance(obj, dict) and obj.get("error") is not None:
                    err = obj["error"]
                    out.append(back.stream_error(err if isinstance(err, dict) else {"message": str(err)}))
                    self._ended = True
                    break
                if isinstance(obj, dict):
                    out.append(back.chunk(obj))
        return b"".join(out)


def _without_length(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in headers if k.lower() != b"content-length"]


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as Anthropic's and the Responses API's streams write them."""
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"


def new_id(prefix: str) -> str:
    """An id in the shape the surfaces' own APIs use: a prefix and 24 hex digits."""
    return prefix + uuid.uuid4().hex[:24]


def streamed(chat: dict[str, Any]) -> dict[str, Any]:
    """The translated chat request streamed, with the usage chunk at its end: a surface's stream reports the tier's
    token counts in its closing event, so it must ask for them."""
    chat["stream"] = True
    chat["stream_options"] = {"include_usage": True}
    return chat
