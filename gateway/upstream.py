"""A pooled client for OpenAI-compatible backends (edge nodes and vLLM servers alike).

One aiohttp session per gateway process keeps connections alive across requests: httpx costs several
times more CPU per request, and the gateway's own overhead budget is about a millisecond.
Timeouts are per phase (connect, first byte, between chunks, total) so a stuck backend is noticed
quickly without cutting off a long but healthy generation. Closing a response closes its connection,
which is how a client's disconnect stops the generation upstream.
"""

from __future__ import annotations

import asyncio
import enum
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import msgspec
from aiohttp.abc import AbstractResolver

from tiergate.core import tracing
from tiergate.core.pool import Endpoint
from tiergate.core.types import Timeouts
from tiergate.core.wire import decode_json
from tiergate.gateway.pools.backend_dns import GuardedResolver

__all__ = ["MAX_ANSWER_BYTES", "MAX_EVENT_BYTES", "FailureKind", "UpstreamClient", "UpstreamFailure", "UpstreamResponse",
           "opens_answer"]

# One SSE line longer than this is a broken backend, not a chunk of an answer: refuse it rather than buffer it.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# A whole JSON answer: far above any real one (a 100k-token answer with logprobs is a few MB), far below what a
# broken or hostile backend could make the gateway buffer.
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class FailureKind(enum.StrEnum):
    """Why a backend gave no usable answer. The values are metric labels and `upstream_<kind>` error codes."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    HTTP_5XX = "http_5xx"  # 5xx or 429: overloaded or broken
    HTTP_4XX = "http_4xx"  # the backend's verdict on the request itself: relayed, not retried
    CAPABILITY = "capability"  # the backend cannot serve this request (context, a feature): a bigger one may
    HTTP_ENDPOINT = "http_endpoint"  # 401/403/404/405: the endpoint is misconfigured
    PROTOCOL = "protocol"
    STREAM = "stream"
    LOST = "lost"  # the endpoint stopped answering its health checks before the answer began
    SHUTDOWN = "shutdown"  # the gateway is shutting down: no backend's fault


class UpstreamFailure(Exception):
    """A backend did not give a usable answer.

    `retryable` is true when nothing reached the client yet and another endpoint may do better
    (connection refused, timeout before the first byte, 5xx); `status` is what the client gets if
    every attempt fails this way. `FailureKind.HTTP_4XX` is the backend's verdict on the request itself
    (400, 413, 422), which no other backend would change; `FailureKind.CAPABILITY` is a backend saying that it
    cannot serve this request (too long for its context, a feature it lacks), which a bigger one may.
    """

    def __init__(self, message: str, *, kind: FailureKind, status: int = 502, retryable: bool = True,
                 body: bytes | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.retryable = retryable
        self.body = body


@dataclass(slots=True)
class UpstreamResponse:
    """An open upstream response; the caller must `close()` it (streams: when done or cancelled).

    `deadline` (event-loop time) bounds reading a non-streaming body: the request's total budget.
    """

    endpoint: Endpoint
    _resp: aiohttp.ClientResponse
    _timeouts: Timeouts
    deadline: float = 0.0

    @property
    def status(self) -> int:
        return self._resp.status

    async def read(self) -> bytes:
        """The whole body, within what is left of the request's total time and within `MAX_ANSWER_BYTES`."""
        declared = self._resp.content_length
        if declared is not None and declared > MAX_ANSWER_BYTES:
            raise self._too_large()
        try:
            async with asyncio.timeout_at(self.deadline or None):
                chunks, size = [], 0
                async for chunk in self._resp.content.iter_any():
                    size += len(chunk)
                    if size > MAX_ANSWER_BYTES:
                        raise self._too_large()
                    chunks.append(chunk)
                return b"".join(chunks)
        except TimeoutError:
            raise UpstreamFailure(f"{self.endpoint.id} did not finish its answer within {self._timeouts.total_s:g}s",
                                  kind=FailureKind.TIMEOUT, status=504, retryable=False) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(f"{self.endpoint.id} broke off the answer: {exc}",
                                  kind=FailureKind.PROTOCOL) from None

    def _too_large(self) -> UpstreamFailure:
        return UpstreamFailure(f"{self.endpoint.id} sent an answer larger than {MAX_ANSWER_BYTES} bytes",
                               kind=FailureKind.PROTOCOL, retryable=False)

    async def events(self) -> AsyncIterator[list[bytes]]:
        """Yield the SSE `data:` payloads (without the prefix) in batches: every complete event received so far.

        A batch is what one read of the socket completed, so a fast backend's events go on to the client in
        one write rather than one each. The stream's last batch ends with the payload `[DONE]`; a stream that
        closes without it raises UpstreamFailure.

        The first batch is the first one that carries a token (`opens_answer`): frames with nothing generated
        yet (the role-only `{"delta": {"role": "assistant", "content": ""}}` that vLLM and llama.cpp servers
        send as soon as they accept a request, before it has a slot or its prefill) are held and come with it.
        Until then the first-byte timeout runs from the first read, however many empty frames arrive, and an
        error event is a failure of this backend before anything reached the client: the request may be
        retried elsewhere. Each later batch may take up to the between-chunks timeout. Each deadline wraps
        only the socket read, never a `yield`: the consumer may be another task, and its own pace (a slow
        client) is not the backend's silence.
        """
        loop = asyncio.get_running_loop()
        between = self._timeouts.between_chunks_s
        content = self._resp.content
        buf = bytearray()
        deadline = loop.time() + self._timeouts.first_byte_s
        held: list[bytes] | None = []  # None once the answer has begun
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await content.readany()
            except TimeoutError:
                when = "mid-stream" if held is None else f"before its first token ({self._timeouts.first_byte_s:g}s)"
                raise UpstreamFailure(f"{self.endpoint.id} went silent {when}", kind=FailureKind.TIMEOUT,
                                      status=504) from None
            except aiohttp.ClientError as exc:
                raise UpstreamFailure(f"{self.endpoint.id} broke off the stream: {exc}",
                                      kind=FailureKind.STREAM) from None
            if not chunk:
                raise UpstreamFailure(f"{self.endpoint.id} closed the stream before [DONE]",
                                      kind=FailureKind.STREAM)
            buf += chunk
            end = buf.rfind(b"\n")
            if end < 0:
                if len(buf) > MAX_EVENT_BYTES:
                    raise UpstreamFailure(f"{self.endpoint.id} sent an event over {MAX_EVENT_BYTES} bytes",
                                          kind=FailureKind.PROTOCOL)
                continue
            lines = bytes(buf[:end]).split(b"\n")
            del buf[:end + 1]
            batch = []
            for line in lines:
                if line.startswith(b"data:"):  # not blank separators, comments, `event:` lines
                    payload = line[5:].strip()
                    batch.append(payload)
                    if payload == b"[DONE]":
                        if held is not None:  # the whole answer in one read: an error first is still a failure
                            _first_token(self.endpoint, batch)
                            batch = held + batch
                        yield batch
                        return
            if not batch:
                continue
            if held is not None:
                opened = _first_token(self.endpoint, batch)
                if opened is None:
                    held += batch  # nothing generated yet: the first-token deadline still runs
                    continue
                batch, held = held + batch, None
            deadline = loop.time() + between
            yield batch

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        self._resp.release()


_ABSENT = msgspec.Raw(b"null")  # msgspec.Raw cannot be optional: a field left out reads as JSON null


def _given(raw: msgspec.Raw) -> bool:
    return bytes(raw) != b"null"


class _Delta(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    reasoning_content: str | None = None  # vLLM's reasoning parsers
    reasoning: str | None = None
    tool_calls: msgspec.Raw = _ABSENT  # any JSON value but null counts
    function_call: msgspec.Raw = _ABSENT


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Frame(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: msgspec.Raw = _ABSENT
    error: msgspec.Raw = _ABSENT


_frame = msgspec.json.Decoder(_Frame)


def opens_answer(payload: bytes) -> bool | None:
    """Whether one SSE payload shows that the answer has begun: True for generated content (text, a tool call, a
    refusal or reasoning), a finish reason, usage, `[DONE]` or anything that is not an OpenAI chunk at all (relayed
    as the backend's own); False for an error event; None for a chunk with nothing generated yet (a role-only or
    empty delta)."""
    if payload == b"[DONE]":
        return True
    try:
        f = decode_json(_frame, payload)
    except msgspec.DecodeError:
        return True
    if _given(f.error):
        return False
    if _given(f.usage) or f.choices is None:
        return True
    for c in f.choices:
        d = c.delta
        if c.finish_reason or c.text or d is not None and (d.content or _given(d.tool_calls) or d.refusal
                                                           or _given(d.function_call) or d.reasoning_content
                                                           or d.reasoning):
            return True
    return None


def _first_token(endpoint: Endpoint, batch: list[bytes]) -> bool | None:
    """True when `batch` opens the answer, None when it holds nothing generated yet; an error event before any
    token is this backend's failure (an engine that died, a node shutting down with the request in its queue)."""
    for payload in batch:
        opened = opens_answer(payload)
        if opened is False:
            raise UpstreamFailure(f"{endpoint.id} failed before its first token: "
                                  f"{payload[:300].decode('utf-8', 'replace')}",
                                  kind=FailureKind.STREAM, body=payload)
        if opened:
            return True
    return None


class UpstreamClient:
    def __init__(self, *, max_connections: int = 1000, tls: ssl.SSLContext | None = None,
                 resolver: AbstractResolver | None = None) -> None:
        self._max_connections = max_connections
        self._ssl = tls  # verifies https:// backends (TIERGATE_BACKEND_CA_FILE); None: the system's CAs
        self._resolver = resolver  # under the guard (None: aiohttp's default resolver)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         resolver=GuardedResolver(self._resolver),  # DNS rebinding: edge_urls
                                         keepalive_timeout=30, ttl_dns_cache=10, enable_cleanup_closed=True,
                                         ssl=self._ssl if self._ssl is not None else True)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              skip_auto_headers=("User-Agent",), timeout=aiohttp.ClientTimeout())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    async def post(self, endpoint: Endpoint, path: str, body: bytes, timeouts: Timeouts, request_id: str,
                   *, stream: bool = True) -> UpstreamResponse:
        """Send a request and wait for the response headers; a non-2xx answer raises UpstreamFailure.

        A stream's headers come before its first token, so they must arrive within connect + first-byte
        time. A non-streaming answer's headers come only once the whole answer is generated, so for
        those the wait is the request's total time, and running out of it is not retried: the budget is spent.
        """
        url = endpoint.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeouts.total_s, sock_connect=timeouts.connect_s)
        headers = {"content-type": "application/json", "x-request-id": request_id, **endpoint.headers}  # its key
        tracing.inject(headers)  # W3C traceparent: the backend's spans join the request's trace (when tracing is on)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s
        wait_s = timeouts.connect_s + timeouts.first_byte_s if stream else timeouts.total_s
        try:
            async with asyncio.timeout(wait_s):
                resp = await self.session.post(url, data=body, headers=headers, timeout=timeout)
        except aiohttp.ConnectionTimeoutError:  # a TimeoutError too: the endpoint never accepted, try another
            raise UpstreamFailure(f"cannot connect to {endpoint.id} within {timeouts.connect_s:g}s",
                                  kind=FailureKind.CONNECT, status=503) from None
        except TimeoutError:
            raise UpstreamFailure(f"{endpoint.id} did not answer within {wait_s:g}s", kind=FailureKind.TIMEOUT,
                                  status=504, retryable=stream) from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure(f"cannot connect to {endpoint.id}: {exc.os_error or exc}",
                                  kind=FailureKind.CONNECT, status=503) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(f"{endpoint.id} failed: {exc}", kind=FailureKind.PROTOCOL) from None
        if resp.status >= 400:
            try:
                async with asyncio.timeout(timeouts.first_byte_s):
                    err_body = await resp.read()
            except (TimeoutError, aiohttp.ClientError):
                err_body = b""
            finally:
                resp.release()
            raise _failure_for_status(endpoint, resp.status, err_body)
        return UpstreamResponse(endpoint, resp, timeouts, deadline)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """Small GETs for health and metrics polling."""
        async with asyncio.timeout(timeout_s):
            async with self.session.get(url) as resp:
                return resp.status, await resp.read()


# The backend judged the request itself (malformed, too long for its context): relay its verdict, do not retry.
_VERDICT_STATUSES = frozenset({400, 413, 422})
# ... unless the verdict is about the backend's own limits: another tier's backend may well serve the request.
# `context_length_exceeded` is what edge nodes (and OpenAI) answer for a prompt longer than the context;
# `unsupported_parameter` / `unsupported_value` are OpenAI's codes for a feature a model lacks. A 413 is always the
# backend's own body limit (the gateway has enforced its own). docs/contracts.md states this for edge nodes.
_CAPABILITY_CODES = frozenset({"context_length_exceeded", "unsupported_parameter", "unsupported_value"})
# Backends that say so only in words (no string code): edge nodes before they sent `unsupported_parameter`, and
# vLLM, whose context-length refusal is a 400 with `code: 400` and OpenAI's old wording, and whose refusal of any
# `tool_choice` but none when the server runs without a tool-call parser names its own flags ("... requires
# --tool-call-parser to be set"): that server cannot call tools, a later tier may.
_CAPABILITY_PHRASES = ("not supported by the edge node", "maximum context length is", "--tool-call-parser to be set")
_error_body = msgspec.json.Decoder()


def _failure_for_status(endpoint: Endpoint, status: int, body: bytes) -> UpstreamFailure:
    """Classify a non-2xx answer: the request's fault (relayed as is) or the endpoint's (another may do better).

    401/403/404/405 mean the endpoint is misconfigured (wrong key, path or model name) and 429/5xx that it is
    overloaded or broken: the client gets a 502 if no other endpoint answers, never the backend's own 401.
    """
    if status in _VERDICT_STATUSES:
        kind = FailureKind.CAPABILITY if status == 413 or _is_capability(body) else FailureKind.HTTP_4XX
        return UpstreamFailure(f"{endpoint.id} answered HTTP {status}", kind=kind, status=status,
                               retryable=False, body=body)
    kind = FailureKind.HTTP_5XX if status >= 500 or status == 429 else FailureKind.HTTP_ENDPOINT
    return UpstreamFailure(f"{endpoint.id} answered HTTP {status}", kind=kind, status=502, body=body)


def _is_capability(body: bytes) -> bool:
    """Whether a 400/422 body says the backend cannot serve the request, rather than that the request is wrong."""
    try:
        err = decode_json(_error_body, body).get("error")
    except (msgspec.DecodeError, AttributeError):
        return False
    if not isinstance(err, dict):
        return False
    code = err.get("code")
    if isinstance(code, str):
        return code in _CAPABILITY_CODES
    message = err.get("message")
    return isinstance(message, str) and any(p in message for p in _CAPABILITY_PHRASES)
