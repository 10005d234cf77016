"""Requests for several answers (`n > 1`, a list of prompts on /v1/completions) as that many single requests.

Each answer is one request of its own through the whole pipeline, one after the other: admitted, limited,
reserved (its prompt plus its `max_tokens`), routed, dispatched and accounted like any request, so an `n: 4`
costs what four requests cost and never holds more than one of its tenant's concurrent slots. Every tier can
serve it, the edge node included, which generates one sequence per request. The answers are merged in order:
choice `index` is `prompt_index * n + choice`, usage is summed (each answer's prompt was processed on its own).
A stream sends each answer's chunks with its own `index`, the answers one after another, then one usage chunk
(when asked for) and `[DONE]`.

Choices of one question must differ, so the sub-requests of `n > 1` bypass the cache (a stored answer would be
every choice) and a `seed` becomes `seed + choice`; each prompt of a list with `n: 1` is an ordinary request,
cached as one. `TIERGATE_MAX_CHOICES` bounds `n × prompts`; token-id prompts are refused with a 400.

Tested in `tests/gateway/test_fanout.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from tiergate.core.errors import OpenAIError, bad_request
from tiergate.core.http import DONE, read_body, replay, sse
from tiergate.core.wire import decode_json
from tiergate.gateway.context import MAX_REQUEST_ID, safe_request_id
from tiergate.policies.costs import format_cost

__all__ = ["FanOut", "Handle", "Plan", "plan"]

log = structlog.get_logger("tiergate.gateway")
Refuse = Callable[[Request, str, OpenAIError | ClientDisconnect], Awaitable[Response]]  # the pipeline's ending
_USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "total_tokens")
_ANY: msgspec.json.Decoder[Any] = msgspec.json.Decoder()
_PROMPT_LIST = re.compile(rb'"prompt"\s*:\s*\[')


class Handle(Protocol):
    """The pipeline's entry (`CompletionPipeline.handle`); `cache: False` keeps the request out of the cache."""

    async def __call__(self, request: Request, kind: str, *, cache: bool = ...) -> Response: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """The single requests one request stands for, in choice-index order, and whether they may use the cache."""

    bodies: tuple[bytes, ...]
    cache: bool
    stream: bool
    include_usage: bool


def plan(body: bytes, kind: str, max_choices: int) -> Plan | None:
    """The requests to send instead of `body`, or None when it asks for one answer (or is malformed: the pipeline
    then answers it, naming the field). Raises a 400 for an `n` or a prompt list it will not serve."""
    if b'"n"' not in body and (kind != "text" or _PROMPT_LIST.search(body) is None):
        return None  # the common case, without decoding the body twice (a key spelled with escapes: the pipeline
        # still refuses what it cannot serve alone)
    try:
        obj = decode_json(_ANY, body)  # any bytes: invalid UTF-8 and deep nesting raise msgspec's errors only
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # the pipeline answers it
    if not isinstance(obj, dict):
        return None
    n = obj.get("n")
    if n is None:
        n = 1
    elif not isinstance(n, int) or isinstance(n, bool):
        return None  # a type error: the pipeline's decoder says so
    if n < 1 or n > max_choices:
        raise bad_request(f"`n` must be from 1 to {max_choices} (TIERGATE_MAX_CHOICES).", param="n")
    prompts: list[Any] = [None]
    if kind == "text" and isinstance(obj.get("prompt"), list):
        prompts = obj["prompt"]
        if not prompts:
            raise bad_request("`prompt` must not be an empty list.", param="prompt")
        if any(isinstance(p, int | list) and not isinstance(p, bool) for p in prompts) or all(
                isinstance(p, int) for p in prompts):
            raise bad_request("Token-id prompts are not supported: send the prompt as text (a string, or a list "
                              "of strings for several prompts).", param="prompt")
        if not all(isinstance(p, str) for p in prompts):
            return None  # the decoder names the element that is not a string
        if len(prompts) * n > max_choices:
            raise bad_request(f"{len(prompts)} prompts × n={n} ask for {len(prompts) * n} answers; the limit is "
                              f"{max_choices} (TIERGATE_MAX_CHOICES).", param="prompt")
    if n == 1 and len(prompts) == 1:
        return None
    seed = obj.get("seed")
    bodies = []
    for prompt in prompts:
        for choice in range(n):
            sub = {k: v for k, v in obj.items() if k != "n"}
            if prompt is not None:
                sub["prompt"] = prompt
            if n > 1 and isinstance(seed, int) and not isinstance(seed, bool):
                sub["seed"] = seed + choice  # the same seed would give the same answer n times
            bodies.append(msgspec.json.encode(sub))
    options = obj.get("stream_options")
    return Plan(tuple(bodies), cache=n == 1, stream=obj.get("stream") is True,
                include_usage=isinstance(options, dict) and options.get("include_usage") is True)


class FanOut:
    """`POST /v1/chat/completions` and `/v1/completions` in front of the pipeline: a request for one answer goes
    to it as it came; one for several goes as that many, merged (`plan`)."""

    def __init__(self, handle: Handle, refuse: Refuse, authenticate: Callable[[str | None], object], *,
                 max_body_bytes: int, body_timeout_s: float, max_choices: int) -> None:
        self._handle, self._refuse, self._authenticate = handle, refuse, authenticate
        self._max_body, self._body_timeout, self._max_choices = max_body_bytes, body_timeout_s, max_choices

    async def handle(self, request: Request, kind: str) -> Response:
        try:
            self._authenticate(request.headers.get("authorization"))
        except OpenAIError:  # the pipeline answers it (401), accounted as every refusal is
            return await self._handle(request, kind)
        try:
            body = await read_body(request, self._max_body, self._body_timeout)
            work = plan(body, kind, self._max_choices)
        except (OpenAIError, ClientDisconnect) as exc:  # settled, logged and counted as the pipeline's own
            return await self._refuse(request, kind, exc)
        if work is None:
            return await self._handle(_replayed(request, body, None), kind)
        rid = safe_request_id(request.headers.get("x-request-id"))
        log.info("fan_out", request_id=rid, endpoint=kind, answers=len(work.bodies), cached=work.cache)
        subs = _Subs(self._handle, request, kind, work, rid)
        if work.stream:
            return _MergedStream(subs)
        return await subs.merged_json()


def _replayed(request: Request, body: bytes, request_id: str | None) -> Request:
    """`request` with `body` as its body (read once already) and, when given, another request id; after the body
    its channel is the client's own, so a disconnect is still noticed."""
    scope = dict(request.scope)
    headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"x-request-id")]
    headers.append((b"content-length", str(len(body)).encode()))
    if request_id is not None:
        headers.append((b"x-request-id", request_id.encode()))
    elif (rid := request.headers.get("x-request-id")) is not None:
        headers.append((b"x-request-id", rid.encode("latin-1")))
    scope["headers"] = headers
    return Request(scope, replay(body, request.receive))


@dataclass(slots=True)
class _Captured:
    """One sub-request's response, as it was sent."""

    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)


class _Subs:
    """The sub-requests of one request, run one after another."""

    def __init__(self, handle: Handle, request: Request, kind: str, work: Plan, rid: str) -> None:
        self.handle, self.request, self.kind, self.work, self.rid = handle, request, kind, work, rid

    def sub_id(self, i: int) -> str:
        suffix = f".{i}"
        return self.rid[:MAX_REQUEST_ID - len(suffix)] + suffix

    async def respond(self, i: int, receive: Receive, send: Send) -> None:
        """Sub-request `i` through the pipeline, its response sent to `send`."""
        sub = _replayed(self.request, self.work.bodies[i], self.sub_id(i))
        response = await self.handle(sub, self.kind, cache=self.work.cache)
        await response(sub.scope, receive, send)

    async def merged_json(self) -> Response:
        choices: list[Any] = []
        usage = dict.fromkeys(_USAGE_FIELDS, 0)
        first: dict[str, Any] | None = None
        headers: dict[str, str] = {}
        tiers: list[str] = []
        overhead_ms = cost = 0.0
        priced = False
        for i in range(len(self.work.bodies)):
            got = _Captured()

            async def capture(message: Message, got: _Captured = got) -> None:
                if message["type"] == "http.response.start":
                    got.status, got.headers = message["status"], list(message.get("headers", []))
                elif message["type"] == "http.response.body":
                    got.body += message.get("body", b"")

            await self.respond(i, self.request.receive, capture)
            sub_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in got.headers}
            if got.status != 200:  # the first refusal or failure is the answer; earlier answers were charged
                sub_headers.pop("content-length", None)
                sub_headers["x-request-id"] = self.rid
                return Response(bytes(got.body), status_code=got.status or 502, headers=sub_headers)
            answer = msgspec.json.decode(bytes(got.body))
            first = first or answer
            headers = headers or sub_headers
            overhead_ms += float(sub_headers.get("x-tiergate-overhead-ms") or 0)
            if "x-tiergate-cost" in sub_headers:
                priced, cost = True, cost + float(sub_headers["x-tiergate-cost"])
            if (tier := sub_headers.get("x-tiergate-tier")) and tier not in tiers:
                tiers.append(tier)
            for choice in answer.get("choices") or ():
                choice["index"] = len(choices)
                choices.append(choice)
            for name in _USAGE_FIELDS:
                usage[name] += int((answer.get("usage") or {}).get(name) or 0)
        assert first is not None
        merged = {**first, "choices": choices, "usage": usage}
        headers.pop("content-length", None)
        headers.pop("x-tiergate-cost", None)  # per answer: the sum below
        headers |= {"x-request-id": self.rid, "x-tiergate-answers": str(len(choices)),
                    "x-tiergate-overhead-ms": f"{overhead_ms:.3f}"}
        if priced:
            headers["x-tiergate-cost"] = format_cost(cost)
        if len(tiers) > 1:  # x-tiergate-tier stays the first answer's
            headers["x-tiergate-answer-tiers"] = ",".join(tiers)
        return Response(msgspec.json.encode(merged), media_type="application/json", headers=headers)


class _MergedStream(Response):
    """The sub-requests' streams as one: each chunk's choices re-indexed, their `[DONE]`s and usage chunks held
    back, one usage chunk (summed, when the client asked) and `[DONE]` at the end. A sub-request refused before
    the stream began is the whole answer; one refused later ends the stream with its error event."""

    def __init__(self, subs: _Subs) -> None:
        super().__init__()
        self._subs = subs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        subs, started = self._subs, False
        usage = dict.fromkeys(_USAGE_FIELDS, 0)
        template: dict[str, Any] | None = None
        for i in range(len(subs.work.bodies)):
            state = _SubStream(index=i)

            async def forward(message: Message, state: _SubStream = state) -> None:
                nonlocal started, template
                if message["type"] == "http.response.start":
                    state.status = message["status"]
                    state.headers = [(k, v) for k, v in message.get("headers", [])
                                     if k not in (b"content-length", b"x-request-id")]
                    if state.status == 200 and not started:
                        started = True
                        headers = [(k, v) for k, v in message.get("headers", [])
                                   if k not in (b"content-length", b"x-request-id")]
                        headers += [(b"x-request-id", subs.rid.encode()),
                                    (b"x-tiergate-answers", str(len(subs.work.bodies)).encode())]
                        await send({"type": "http.response.start", "status": 200, "headers": headers})
                    return
                if message["type"] != "http.response.body":
                    return
                if state.status != 200:
                    state.error += message.get("body", b"")
                    return
                out = bytearray()
                for payload in state.feed(message.get("body", b"")):
                    chunk = _reindexed(payload, state, usage)
                    if chunk is not None:
                        template = template or state.template
                        out += sse(chunk)
                if out:
                    await send({"type": "http.response.body", "body": bytes(out), "more_body": True})

            await subs.respond(i, receive, forward)
            if state.status != 200:
                if not started:  # nothing sent yet: the refusal is the answer, as it was sent
                    await send({"type": "http.response.start", "status": state.status or 502,
                                "headers": [*state.headers, (b"x-request-id", subs.rid.encode())]})
                    await send({"type": "http.response.body", "body": bytes(state.error)})
                    return
                await send({"type": "http.response.body", "body": sse(bytes(state.error)) + DONE})
                return
            if state.failed:  # its stream ended in an error event (already sent): no more answers
                break
        tail = b""
        if subs.work.include_usage and template is not None:
            tail += sse(msgspec.json.encode({**template, "choices": [], "usage": usage}))
        await send({"type": "http.response.body", "body": tail + DONE})


@dataclass(slots=True)
class _SubStream:
    """One sub-request's stream as it is read: frames split on blank lines, whatever the send boundaries."""

    index: int
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)  # its response's, as sent to it
    error: bytearray = field(default_factory=bytearray)
    pending: bytes = b""
    failed: bool = False
    template: dict[str, Any] | None = None  # id, object, created, model of its chunks: the usage chunk's shape

    def feed(self, data: bytes) -> list[bytes]:
        """The `data:` payloads completed by `data`."""
        frames = (self.pending + data).split(b"\n\n")
        self.pending = frames.pop()
        return [f[len(b"data: "):].strip() for f in frames if f.startswith(b"data: ")]


def _reindexed(payload: bytes, state: _SubStream, usage: dict[str, int]) -> bytes | None:
    """The chunk to send for one of a sub-stream's payloads, or None for its `[DONE]` and usage-only chunks."""
    if payload == b"[DONE]":
        return None
    try:
        obj = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return payload
    if not isinstance(obj, dict):
        return payload
    if "error" in obj:
        state.failed = True
        return payload
    if isinstance(u := obj.get("usage"), dict):
        for name in _USAGE_FIELDS:
            usage[name] += int(u.get(name) or 0)
    choices = obj.get("choices")
    if not choices:
        return None  # a usage-only chunk: summed into the one sent at the end
    for choice in choices:
        if isinstance(choice, dict):
            choice["index"] = state.index
    state.template = {k: obj[k] for k in ("id", "object", "created", "model") if k in obj}
    if isinstance(u, dict):
        obj["usage"] = None  # counted: the client gets the sum, once, at the end
    return msgspec.json.encode(obj)
