"""The edge node's HTTP surface: OpenAI-compatible endpoints over the batching engine.

`/v1/chat/completions` and `/v1/completions` (streaming as SSE ending in `data: [DONE]`, or whole),
`/v1/models`, `/health` (slots, busy, queued: what the gateway balances on) and Prometheus `/metrics`.
Requests are decoded with the gateway's msgspec structs (`gateway.schemas`), so the edge accepts
exactly what the gateway forwards. A client that disconnects cancels its generation at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from edge_node.chat import ChatTemplateError
from edge_node.engine import (
    Chunk,
    ContextOverflowError,
    Engine,
    EngineClosedError,
    EngineError,
    EngineFailedError,
    Generation,
    QueueFullError,
)
from edge_node.metrics import EdgeMetrics
from edge_node.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, SamplingParams
from gateway.schemas import ChatRequest, CompletionRequest, decode_chat, decode_completion

__all__ = ["ServerState", "create_app", "error_response"]

log = structlog.get_logger("edge_node.server")

_json = msgspec.json.Encoder()
_PARAM_RE = re.compile(r"at `\$\.?([^`]*)`")
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


class _ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param
        self.retry_after_s = retry_after_s


def error_response(status: int, message: str, type_: str = "invalid_request_error",
                   code: str | None = None, param: str | None = None, retry_after_s: int | None = None) -> Response:
    """An error in OpenAI's shape: {"error": {"message", "type", "code", "param"}}."""
    body = {"error": {"message": message, "type": type_, "code": code, "param": param}}
    headers = {"retry-after": str(retry_after_s)} if retry_after_s is not None else None
    return Response(_json.encode(body), status_code=status, media_type="application/json", headers=headers)


@dataclass(slots=True)
class ServerState:
    """What the app needs besides the engine; `draining` flips on SIGTERM."""

    engine: Engine
    model_name: str
    max_body_bytes: int = 8 << 20
    draining: bool = False
    node_id: str | None = None
    started: int = field(default_factory=lambda: int(time.time()))
    on_startup: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_shutdown: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


class _SSEResponse(StreamingResponse):
    """StreamingResponse that always closes its generator, so a vanished client cancels generation now."""

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[override]
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


def _sse(obj: Any) -> bytes:
    return b"data: " + _json.encode(obj) + b"\n\n"


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _params(req: ChatRequest | CompletionRequest, max_tokens: int | None, n_vocab: int) -> SamplingParams:
    if req.n not in (None, 1):
        raise _ApiError(400, "n > 1 is not supported by the edge node", param="n",
                        code="unsupported_parameter")
    bias: dict[int, float] = {}
    for k, v in (req.logit_bias or {}).items():
        try:
            bias[int(k)] = float(v)
        except ValueError:
            raise _ApiError(400, f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
    p = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=DEFAULT_TOP_K if req.top_k is None else req.top_k,
        min_p=DEFAULT_MIN_P if req.min_p is None else req.min_p,
        seed=req.seed,
        max_tokens=max_tokens,
        stop=_stops(req.stop),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=bias,
    )
    bad = p.validate(n_vocab)
    if bad:
        raise _ApiError(400, bad, param=bad.split(" ", 1)[0])
    return p


def _usage(c: Chunk) -> dict[str, Any]:
    return {
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": c.cached_tokens},
    }


def _sse_error(message: str, code: str) -> bytes:
    return _sse({"error": {"message": message, "type": "server_error", "code": code, "param": None}})


async def _terminated(frames: AsyncIterator[bytes], gen: Generation,
                     metrics: EdgeMetrics) -> AsyncIterator[bytes]:
    """An SSE body that always ends with `[DONE]`: a failure mid-stream (the engine's, or a bug here) becomes
    an error event first, as the headers are already sent; the generation is cancelled however the stream
    ends (finished, failed or the client gone). Its end is logged (under the request id bound by the
    handler), as a JSON answer's is."""
    started, outcome = time.perf_counter(), "client_gone"
    try:
        async for chunk in frames:
            yield chunk
        outcome = "done"
        yield b"data: [DONE]\n\n"
    except EngineError as e:
        outcome = "engine_error"
        log.warning("stream failed", error=str(e))
        metrics.request_errors.labels("engine").inc()
        yield _sse_error(str(e), "engine_error")
        yield b"data: [DONE]\n\n"
    except Exception:
        outcome = "internal_error"
        log.exception("stream failed")
        metrics.request_errors.labels("internal").inc()
        yield _sse_error("internal error in the edge node; it has been logged", "internal_error")
        yield b"data: [DONE]\n\n"
    finally:
        gen.cancel()
        log.info("stream ended", outcome=outcome, prompt_tokens=gen.prompt_tokens,
                 completion_tokens=gen.completion_tokens, ms=round((time.perf_counter() - started) * 1000, 1))


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


def create_app(state: ServerState) -> Starlette:
    engine = state.engine
    metrics = engine.metrics

    async def read_body(request: Request) -> bytes:
        """The body, refused with 413 as soon as it is known to be too large (declared or counted)."""
        limit = state.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _ApiError(413, f"request body is {declared} bytes; the limit is {limit}", code="body_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:  # chunked: stop reading here, never buffer the rest
                raise _ApiError(413, f"request body exceeds {limit} bytes", code="body_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    def decode(fn, body: bytes):
        try:
            return fn(body)
        except msgspec.ValidationError as e:
            m = _PARAM_RE.search(str(e))
            raise _ApiError(400, str(e), param=m.group(1) if m else None) from None
        except msgspec.DecodeError as e:
            raise _ApiError(400, f"request body is not valid JSON: {e}") from None
        except UnicodeDecodeError as e:  # msgspec's str fields reject bytes that are not UTF-8 this way
            raise _ApiError(400, f"request body is not valid UTF-8 JSON: {e.reason} at byte {e.start}") from None

    def submit(request: Request, tokens: list[int], params: SamplingParams, endpoint: str) -> Generation:
        """Hand the request to the engine (or refuse it in the API's terms); its end is logged by `guard`."""
        if state.draining:
            raise _ApiError(503, "the edge node is draining and takes no new requests", "server_error",
                            code="draining")
        try:  # the engine tells a dead decode loop (EngineFailedError: 503 engine_failed) from a stopping one
            gen = engine.submit(tokens, params, endpoint)
        except ContextOverflowError as e:
            raise _ApiError(400, str(e), code="context_length_exceeded", param="messages"
                            if endpoint == "chat" else "prompt") from None
        except EngineClosedError as e:
            raise _ApiError(503, str(e), "server_error", code="draining") from None
        except QueueFullError as e:
            raise _ApiError(429, str(e), "rate_limit_error", code="queue_full", retry_after_s=1) from None
        except ValueError as e:
            raise _ApiError(400, str(e)) from None
        request.state.generation = gen
        log.info("accepted", path=request.url.path, prompt_tokens=gen.prompt_tokens, max_tokens=params.max_tokens)
        return gen

    async def collect(request: Request, gen: Generation) -> tuple[str, Chunk]:
        """Gather a whole answer; cancel generation if the client leaves first."""

        async def run() -> tuple[str, Chunk]:
            parts: list[str] = []
            async for c in gen:
                parts.append(c.text)
                if c.finish_reason is not None:
                    return "".join(parts), c
            raise EngineError("generation ended without a finish reason")

        task = asyncio.ensure_future(run())
        watch = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():  # the client went away (or we were cancelled): nobody reads this answer
                task.cancel()
                gen.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if task.cancelled():  # counted by the engine (requests_cancelled) when it drops the generation
            raise _ApiError(499, "client closed the request", code="client_closed_request")
        return task.result()

    def guard(handler: Callable[[Request], Awaitable[Response]]):
        async def wrapped(request: Request) -> Response:
            """Bind the request id for every log line of this request, echo it, log how the request ended."""
            rid = request.headers.get("x-request-id") or uuid.uuid4().hex
            structlog.contextvars.bind_contextvars(request_id=rid)
            started = time.perf_counter()
            resp = await answer(request, rid)
            resp.headers["x-request-id"] = rid
            if not isinstance(resp, StreamingResponse):  # a stream logs its own end (see _terminated)
                gen: Generation | None = getattr(request.state, "generation", None)
                log.info("request", path=request.url.path, status=resp.status_code,
                         prompt_tokens=gen.prompt_tokens if gen else None,
                         completion_tokens=gen.completion_tokens if gen else None,
                         ms=round((time.perf_counter() - started) * 1000, 1))
            return resp

        async def answer(request: Request, rid: str) -> Response:
            try:
                return await handler(request)
            except _ApiError as e:
                metrics.request_errors.labels(e.code or str(e.status)).inc()
                return error_response(e.status, e.message, e.type, e.code, e.param, e.retry_after_s)
            except EngineFailedError as e:
                metrics.request_errors.labels("engine_failed").inc()
                return error_response(503, str(e), "server_error", code="engine_failed")
            except EngineError as e:
                log.warning("generation failed", error=str(e))
                metrics.request_errors.labels("engine").inc()
                return error_response(500, str(e), "server_error", code="engine_error")
            except ClientDisconnect:  # gone while sending its body: nobody to answer
                return Response(status_code=499)
            except Exception:  # a bug: logged with its traceback, answered in the API's own error format
                log.exception("request failed", path=request.url.path)
                metrics.request_errors.labels("internal").inc()
                return error_response(500, f"internal error in the edge node (request {rid}); it has been logged",
                                      "server_error", code="internal_error")
        return wrapped

    # ---------------------------------------------------------------- chat

    async def chat_completions(request: Request) -> Response:
        req: ChatRequest = decode(decode_chat, await read_body(request))
        if req.logprobs:
            raise _ApiError(400, "logprobs are not supported by the edge node", param="logprobs",
                            code="unsupported_parameter")
        rf = req.response_format
        if rf and rf.get("type") not in (None, "text"):
            raise _ApiError(400, "response_format other than text is not supported by the edge node",
                            param="response_format", code="unsupported_value")
        if not req.messages:
            raise _ApiError(400, "messages must not be empty", param="messages")
        params = _params(req, req.effective_max_tokens(), engine.rt.n_vocab)
        messages = []
        for m in req.messages:
            d: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.name is not None:
                d["name"] = m.name
            if m.tool_calls is not None:
                d["tool_calls"] = m.tool_calls
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            messages.append(d)
        try:
            tokens = await _maybe_in_thread(lambda: engine.tokenize_chat(messages, req.tools),
                                            sum(len(m["content"]) for m in messages))
        except ChatTemplateError as e:
            raise _ApiError(400, str(e), param="messages") from None
        gen = submit(request, tokens, params, "chat")
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        model = state.model_name
        if not req.stream:
            text, last = await collect(request, gen)
            return Response(_json.encode({
                "id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": None, "finish_reason": last.finish_reason}],
                "usage": _usage(last),
            }), media_type="application/json")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def frame(delta: dict[str, Any], finish: str | None) -> bytes:
            obj: dict[str, Any] = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                                   "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                "finish_reason": finish}]}
            if include_usage:
                obj["usage"] = None
            return _sse(obj)

        async def frames() -> AsyncIterator[bytes]:
            yield frame({"role": "assistant", "content": ""}, None)
            async for c in gen:
                if c.text:
                    yield frame({"content": c.text}, None)
                if c.finish_reason is not None:
                    yield frame({}, c.finish_reason)
                    if include_usage:
                        yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                                    "model": model, "choices": [], "usage": _usage(c)})

        return _SSEResponse(_terminated(frames(), gen, metrics), media_type="text/event-stream", headers=_SSE_HEADERS)

    # ---------------------------------------------------------------- completions

    async def completions(request: Request) -> Response:
        req: CompletionRequest = decode(decode_completion, await read_body(request))
        if req.logprobs:
            raise _ApiError(400, "logprobs are not supported by the edge node", param="logprobs",
                            code="unsupported_parameter")
        if req.suffix:
            raise _ApiError(400, "suffix is not supported by the edge node", param="suffix",
                            code="unsupported_parameter")
        if req.best_of not in (None, 1):
            raise _ApiError(400, "best_of > 1 is not supported by the edge node", param="best_of",
                            code="unsupported_parameter")
        if isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise _ApiError(400, "exactly one prompt per request is supported by the edge node", param="prompt")
            prompt = req.prompt[0]
        else:
            prompt = req.prompt
        if not prompt:
            raise _ApiError(400, "prompt must not be empty", param="prompt")
        max_tokens = req.max_tokens if req.max_tokens is not None else _COMPLETIONS_DEFAULT_MAX_TOKENS
        params = _params(req, max_tokens, engine.rt.n_vocab)
        tokens = await _maybe_in_thread(lambda: engine.tokenize_prompt(prompt), len(prompt))
        gen = submit(request, tokens, params, "completions")
        rid = f"cmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        model = state.model_name
        echo = prompt if req.echo else ""
        if not req.stream:
            text, last = await collect(request, gen)
            return Response(_json.encode({
                "id": rid, "object": "text_completion", "created": created, "model": model,
                "choices": [{"index": 0, "text": echo + text, "logprobs": None,
                             "finish_reason": last.finish_reason}],
                "usage": _usage(last),
            }), media_type="application/json")
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def frame(text: str, finish: str | None) -> bytes:
            obj: dict[str, Any] = {"id": rid, "object": "text_completion", "created": created, "model": model,
                                   "choices": [{"index": 0, "text": text, "logprobs": None,
                                                "finish_reason": finish}]}
            if include_usage:
                obj["usage"] = None
            return _sse(obj)

        async def frames() -> AsyncIterator[bytes]:
            if echo:
                yield frame(echo, None)
            async for c in gen:
                if c.finish_reason is not None:
                    yield frame(c.text, c.finish_reason)
                    if include_usage:
                        yield _sse({"id": rid, "object": "text_completion", "created": created,
                                    "model": model, "choices": [], "usage": _usage(c)})
                elif c.text:
                    yield frame(c.text, None)

        return _SSEResponse(_terminated(frames(), gen, metrics), media_type="text/event-stream", headers=_SSE_HEADERS)

    # ---------------------------------------------------------------- info

    async def models(_request: Request) -> Response:
        return Response(_json.encode({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.started, "owned_by": "tiergate-edge",
            "max_model_len": engine.ctx_per_slot,
        }]}), media_type="application/json")

    async def health(_request: Request) -> Response:
        s = engine.stats()
        failed = engine.failure is not None
        status = "failed" if failed else "draining" if state.draining else "ok"
        body = {"status": status, "model": state.model_name, "slots": s.slots, "busy": s.busy,
                "queued": s.queued, "ctx": s.ctx_per_slot, "kv_cells_used": s.kv_cells_used,
                "kv_cells_total": s.kv_cells_total, "node_id": state.node_id}
        if failed:
            body["error"] = engine.failure
        return Response(_json.encode(body), status_code=503 if failed or state.draining else 200,
                        media_type="application/json")

    async def metrics_endpoint(_request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def not_found(request: Request, _exc: Exception) -> Response:
        return error_response(404, f"no route for {request.method} {request.url.path}", code="not_found")

    async def method_not_allowed(request: Request, _exc: Exception) -> Response:
        return error_response(405, f"method {request.method} not allowed on {request.url.path}",
                              code="method_not_allowed")

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette):
        engine.start()
        for fn in state.on_startup:
            await fn()
        try:
            yield
        finally:
            for fn in state.on_shutdown:
                with contextlib.suppress(Exception):
                    await fn()
            await asyncio.to_thread(engine.stop)

    routes = [
        Route("/v1/chat/completions", guard(chat_completions), methods=["POST"]),
        Route("/v1/completions", guard(completions), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_endpoint, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: method_not_allowed})


_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _maybe_in_thread(fn: Callable[[], list[int]], size: int) -> list[int]:
    """Tokenize inline when short; long prompts go to a worker thread so the event loop keeps streaming."""
    if size < 4096:
        return fn()
    return await asyncio.to_thread(fn)
