"""The edge node's completion endpoints: `/v1/chat/completions` and `/v1/completions`, one path for both.

A request is decoded with the project's OpenAI structs (`core.wire`, so the edge accepts exactly what the
gateway forwards), checked for what this node cannot do (refused with 400 `unsupported_parameter` /
`unsupported_value`, which a gateway reads as "send it to the next tier"), turned into prompt tokens (the chat
template, or the text as is), handed to the batching engine, and answered whole or as SSE ending in
`data: [DONE]`. The two endpoints differ only in how the prompt is built and in the shape of their answers
(`edge_node.server.answers`). Chat requests may ask for JSON (`response_format`) or a tool call, served by
grammar-constrained decoding (`edge_node.server.structured`); both endpoints report token log-probabilities
(`logprobs`, `top_logprobs` up to 20). A client that disconnects cancels its generation at once.

Tested in `tests/edge_node/engine/test_sampling.py`, `tests/edge_node/server/test_app.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from tiergate.core.errors import OpenAIError, bad_request
from tiergate.core.http import DONE, error_response, read_body
from tiergate.core.wire import (
    MAX_TOP_LOGPROBS,
    ChatRequest,
    CompletionRequest,
    decode_json,
)
from tiergate.edge_node.engine.engine import (
    Chunk,
    ContextOverflowError,
    Engine,
    EngineClosedError,
    EngineError,
    EngineFailedError,
    Generation,
    QueueFullError,
)
from tiergate.edge_node.engine.sampling import DEFAULT_MIN_P, DEFAULT_TOP_K, SamplingParams, check_grammar
from tiergate.edge_node.server.answers import Answer, sse
from tiergate.edge_node.server.chat import ChatTemplateError
from tiergate.edge_node.server.logprobs import TokenLogprob
from tiergate.edge_node.server.metrics import EdgeMetrics
from tiergate.edge_node.server.state import ServerState
from tiergate.edge_node.server.structured import Structured, plan, read_tool_calls

__all__ = ["Completions", "sampling_params"]

log = structlog.get_logger("edge_node.server")

_json = msgspec.json.Encoder()
_PARAM_RE = re.compile(r"at `\$\.?([^`]*)`")
_COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint
_INLINE_TOKENIZE_CHARS = 4096  # longer prompts are tokenized in a worker thread, so the event loop keeps streaming
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Handler = Callable[[Request], Awaitable[Response]]


def _unsupported(message: str, param: str, code: str = "unsupported_parameter") -> OpenAIError:
    return bad_request(message, code=code, param=param)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def sampling_params(req: ChatRequest | CompletionRequest, max_tokens: int | None, n_vocab: int, *,
                    logprobs: int | None = None, grammar: str | None = None) -> SamplingParams:
    """The engine's sampling parameters for a request, or a 400 naming the parameter that is out of range."""
    if req.n not in (None, 1):
        raise _unsupported("n > 1 is not supported by the edge node", "n")
    bias: dict[int, float] = {}
    for k, v in (req.logit_bias or {}).items():
        try:
            bias[int(k)] = float(v)
        except ValueError:
            raise bad_request(f"logit_bias keys must be token ids, got {k!r}", param="logit_bias") from None
    p = SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=DEFAULT_TOP_K if req.top_k is None else max(req.top_k, 0),  # vLLM's -1 is "off" too
        min_p=DEFAULT_MIN_P if req.min_p is None else req.min_p,
        seed=req.seed,
        max_tokens=max_tokens,
        stop=_stops(req.stop),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        logit_bias=bias,
        logprobs=logprobs,
        grammar=grammar,
    )
    bad = p.validate(n_vocab)
    if bad:
        raise bad_request(bad, param=bad.split(" ", 1)[0])
    return p


def _decode(fn: Callable[[bytes], Any], body: bytes) -> Any:
    try:
        return fn(body)
    except msgspec.ValidationError as e:
        m = _PARAM_RE.search(str(e))
        raise bad_request(str(e), param=m.group(1) if m else None) from None
    except msgspec.DecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}") from None


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request ready for the engine: its prompt tokens and sampling, and how to answer it."""

    answer: Answer
    tokens: list[int]
    params: SamplingParams
    stream: bool
    include_usage: bool
    echo: str = ""  # text completions with `echo`: the prompt comes first in the answer
    structured: Structured | None = None  # JSON or tool calls: how the answer is constrained and read


class _NodeChatRequest(ChatRequest, kw_only=True):
    """A chat request as the node reads it: it serves one model, so `model` may be left out or null (as
    llama-server and vLLM allow); any name is answered by that model. The gateway, which routes on it, needs it."""

    model: str | None = None  # type: ignore[assignment]  # optional here only


class _NodeCompletionRequest(CompletionRequest, kw_only=True):
    """A text completion request as the node reads it (`model` optional, see _NodeChatRequest)."""

    model: str | None = None  # type: ignore[assignment]  # optional here only


_chat_decoder = msgspec.json.Decoder(_NodeChatRequest)
_completion_decoder = msgspec.json.Decoder(_NodeCompletionRequest)


def decode_chat(body: bytes) -> ChatRequest:
    return decode_json(_chat_decoder, body)


def decode_completion(body: bytes) -> CompletionRequest:
    return decode_json(_completion_decoder, body)


class _ToolFlags(msgspec.Struct):
    """The one tool-call parameter the shared request structs do not model (the gateway forwards it as is)."""

    parallel_tool_calls: bool | None = None


_tool_flags = msgspec.json.Decoder(_ToolFlags)


class Completions:
    """Both completion endpoints of one edge node, over its engine."""

    def __init__(self, state: ServerState) -> None:
        self._state = state
        self._engine: Engine = state.engine
        self._metrics: EdgeMetrics = state.engine.metrics

    # ---- the two endpoints: only the prompt differs --------------------------------------------------------------

    async def chat(self, request: Request) -> Response:
        body = await read_body(request, self._state.max_body_bytes)
        req: ChatRequest = _decode(decode_chat, body)
        if not req.messages:
            raise bad_request("messages must not be empty", param="messages")
        top = req.top_logprobs
        if top is not None and not req.logprobs:
            raise bad_request("`top_logprobs` needs `logprobs: true`.", param="top_logprobs")
        parallel = _decode(_tool_flags.decode, body).parallel_tool_calls if req.tools else None
        structured = plan(req.response_format, req.tools, req.tool_choice, parallel)
        grammar = self._grammar(structured)
        params = sampling_params(req, req.effective_max_tokens(), self._engine.rt.n_vocab,
                                 logprobs=(top or 0) if req.logprobs else None, grammar=grammar)
        messages = []
        for i, m in enumerate(req.messages):
            if isinstance(m.content, list):
                for j, part in enumerate(m.content):
                    if part.type != "text":  # never drop what the model cannot see and answer as if it had
                        raise _unsupported(f"content parts of type {part.type!r} are not supported by the edge node: "
                                           "its model reads text only", f"messages[{i}].content[{j}].type",
                                           code="unsupported_value")
            d: dict[str, Any] = {"role": m.role, "content": m.text()}
            if m.name is not None:
                d["name"] = m.name
            if m.tool_calls is not None:
                d["tool_calls"] = m.tool_calls
            if m.tool_call_id is not None:
                d["tool_call_id"] = m.tool_call_id
            messages.append(d)
        template = self._engine.rt.chat_template
        if structured is not None and structured.system_note and not template.renders_tools:
            messages = _with_system_note(messages, structured.system_note)
        tools = req.tools if req.tool_choice != "none" else None
        try:
            tokens = await _tokenize(lambda: self._engine.tokenize_chat(messages, tools),
                                     sum(len(m["content"]) for m in messages))
        except ChatTemplateError as e:
            raise bad_request(str(e), param="messages") from None
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await self._serve(request, _Prepared(Answer("chat", self._state.model_name), tokens, params,
                                                    bool(req.stream), include_usage, structured=structured))

    async def text(self, request: Request) -> Response:
        req: CompletionRequest = _decode(decode_completion, await read_body(request, self._state.max_body_bytes))
        logprobs = req.logprobs
        if isinstance(logprobs, bool) or (logprobs is not None and not 0 <= logprobs <= MAX_TOP_LOGPROBS):
            raise bad_request(f"`logprobs` must be an integer from 0 to {MAX_TOP_LOGPROBS}.", param="logprobs")
        if logprobs is not None and req.echo:
            raise _unsupported("logprobs of the prompt (echo with logprobs) are not supported by the edge node",
                               "echo")
        if req.suffix:
            raise _unsupported("suffix is not supported by the edge node", "suffix")
        if req.best_of not in (None, 1):
            raise _unsupported("best_of > 1 is not supported by the edge node", "best_of")
        if isinstance(req.prompt, list):
            if len(req.prompt) != 1:
                raise bad_request("exactly one prompt per request is supported by the edge node", param="prompt")
            prompt = req.prompt[0]
        else:
            prompt = req.prompt
        if not prompt:
            raise bad_request("prompt must not be empty", param="prompt")
        max_tokens = req.max_tokens if req.max_tokens is not None else _COMPLETIONS_DEFAULT_MAX_TOKENS
        params = sampling_params(req, max_tokens, self._engine.rt.n_vocab, logprobs=logprobs)
        tokens = await _tokenize(lambda: self._engine.tokenize_prompt(prompt), len(prompt))
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        answer = Answer("text", self._state.model_name, text_offset=len(prompt))
        return await self._serve(request, _Prepared(answer, tokens, params, bool(req.stream), include_usage,
                                                    prompt if req.echo else ""))

    def _grammar(self, structured: Structured | None) -> str | None:
        """The request's grammar, checked now: one llama.cpp cannot parse is a 400, never a failed decode."""
        if structured is None:
            return None
        rt = self._engine.rt
        if not check_grammar(rt.llama, rt.vocab, structured.grammar):
            raise bad_request("The schema's grammar is not accepted by llama.cpp.", code="invalid_schema",
                              param="response_format" if not (structured.tool_call or structured.auto) else "tools")
        return structured.grammar

    # ---- the shared path -----------------------------------------------------------------------------------------

    async def _serve(self, request: Request, p: _Prepared) -> Response:
        gen = self._submit(request, p)
        if not p.stream:
            text, last, tokens = await self._collect(request, gen)
            s = p.structured
            calls = read_tool_calls(text) if s is not None and s.is_call(text) else None
            return Response(p.answer.whole(p.echo + text, last, tokens, calls), media_type="application/json")
        return _SSEResponse(self._terminated(self._frames(p, gen), gen), media_type="text/event-stream",
                            headers=_SSE_HEADERS)

    def _submit(self, request: Request, p: _Prepared) -> Generation:
        """Hand the request to the engine (or refuse it in the API's terms); its end is logged by `guarded`."""
        if self._state.draining:
            raise OpenAIError(503, "the edge node is draining and takes no new requests", type="server_error",
                              code="draining")
        endpoint = "chat" if p.answer.kind == "chat" else "completions"
        try:  # the engine tells a dead decode loop (EngineFailedError: 503 engine_failed) from a stopping one
            gen = self._engine.submit(p.tokens, p.params, endpoint)
        except ContextOverflowError as e:
            raise bad_request(str(e), code="context_length_exceeded",
                              param="messages" if endpoint == "chat" else "prompt") from None
        except EngineClosedError as e:
            raise OpenAIError(503, str(e), type="server_error", code="draining") from None
        except QueueFullError as e:
            raise OpenAIError(429, str(e), type="rate_limit_error", code="queue_full",
                              headers={"retry-after": "1"}) from None
        except ValueError as e:
            raise bad_request(str(e)) from None
        request.state.generation = gen
        log.info("accepted", path=request.url.path, prompt_tokens=gen.prompt_tokens, max_tokens=p.params.max_tokens)
        return gen

    async def _collect(self, request: Request,
                       gen: Generation) -> tuple[str, Chunk, list[TokenLogprob] | None]:
        """Gather a whole answer (and its tokens' log-probabilities); cancel generation if the client leaves."""
        task = asyncio.ensure_future(_gather(gen))
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
            raise OpenAIError(499, "client closed the request", code="client_closed_request")
        return task.result()

    async def _frames(self, p: _Prepared, gen: Generation) -> AsyncIterator[bytes]:
        answer, usage, s = p.answer, p.include_usage, p.structured
        chunks: AsyncIterator[Chunk] = gen
        if s is not None and (s.tool_call or s.auto):
            # `auto`: the first non-blank character says whether this is a call or text (see structured.py)
            head: list[Chunk] = []
            seen = ""
            if s.auto:
                async for c in gen:
                    head.append(c)
                    seen += c.text
                    if seen.strip() or c.finish_reason is not None:
                        break
            if s.is_call(seen):  # calls are streamed whole once complete (see Answer.tool_call_chunk)
                if head and head[-1].finish_reason is not None:
                    last = head[-1]
                else:
                    rest, last, _ = await _gather(gen)
                    seen += rest
                yield answer.tool_call_chunk(read_tool_calls(seen), usage)
                yield answer.chunk(None, "tool_calls" if last.finish_reason == "stop" else last.finish_reason,
                                   usage)
                if usage:
                    yield answer.usage(last)
                return
            chunks = _replay(head, gen)
        if answer.kind == "chat":
            yield answer.chunk(None, None, usage, role=True)
        elif p.echo:
            yield answer.chunk(p.echo, None, usage)
        async for c in chunks:
            if c.finish_reason is None:
                if c.text or c.logprobs:
                    yield answer.chunk(c.text, None, usage, tokens=c.logprobs)
                continue
            if answer.kind == "chat":  # a chat's last piece of text and its finish reason go in separate deltas
                if c.text or c.logprobs:
                    yield answer.chunk(c.text, None, usage, tokens=c.logprobs)
                yield answer.chunk(None, c.finish_reason, usage)
            else:
                yield answer.chunk(c.text, c.finish_reason, usage, tokens=c.logprobs)
            if usage:
                yield answer.usage(c)

    async def _terminated(self, frames: AsyncIterator[bytes], gen: Generation) -> AsyncIterator[bytes]:
        """An SSE body that always ends with `[DONE]`: a failure mid-stream (the engine's, or a bug here) becomes
        an error event first, as the headers are already sent; the generation is cancelled however the stream
        ends (finished, failed or the client gone). Its end is logged (under the request id bound by
        `guarded`), as a JSON answer's is."""
        started, outcome = time.perf_counter(), "client_gone"
        try:
            async for chunk in frames:
                yield chunk
            outcome = "done"
            yield DONE
        except EngineError as e:
            outcome = "engine_error"
            log.warning("stream failed", error=str(e))
            self._metrics.request_errors.labels("engine").inc()
            yield sse(_engine_error(e).body())
            yield DONE
        except Exception:
            outcome = "internal_error"
            log.exception("stream failed")
            self._metrics.request_errors.labels("internal").inc()
            yield sse(OpenAIError(500, "internal error in the edge node; it has been logged", type="server_error",
                                   code="internal_error").body())
            yield DONE
        finally:
            gen.cancel()
            log.info("stream ended", outcome=outcome, prompt_tokens=gen.prompt_tokens,
                     completion_tokens=gen.completion_tokens, ms=round((time.perf_counter() - started) * 1000, 1))

    # ---- errors and the request log line -----------------------------------------------------------------------

    def guarded(self, handler: Handler) -> Handler:
        """Bind the request id to every log line of the request, echo it, turn every failure into an OpenAI error
        answer, and log how the request ended."""
        metrics = self._metrics

        async def answer(request: Request, rid: str) -> Response:
            try:
                return await handler(request)
            except OpenAIError as e:
                metrics.request_errors.labels(e.code or str(e.status)).inc()
                return error_response(e)
            except EngineFailedError as e:
                metrics.request_errors.labels("engine_failed").inc()
                return error_response(OpenAIError(503, str(e), type="server_error", code="engine_failed"))
            except EngineError as e:
                log.warning("generation failed", error=str(e))
                metrics.request_errors.labels("engine").inc()
                return error_response(_engine_error(e))
            except ClientDisconnect:  # gone while sending its body: nobody to answer
                return Response(status_code=499)
            except Exception:  # a bug: logged with its traceback, answered in the API's own error format
                log.exception("request failed", path=request.url.path)
                metrics.request_errors.labels("internal").inc()
                return error_response(OpenAIError(500, f"internal error in the edge node (request {rid}); it has "
                                                       "been logged", type="server_error", code="internal_error"))

        async def wrapped(request: Request) -> Response:
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

        return wrapped


class _SSEResponse(StreamingResponse):
    """StreamingResponse that always closes its generator, so a vanished client cancels generation now."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()


async def _wait_disconnect(request: Request) -> None:
    while True:
        msg = await request.receive()
        if msg["type"] == "http.disconnect":
            return


async def _replay(head: list[Chunk], gen: Generation) -> AsyncIterator[Chunk]:
    """The chunks already read, then the rest of the generation."""
    for c in head:
        yield c
        if c.finish_reason is not None:
            return
    async for c in gen:
        yield c


async def _gather(gen: Generation) -> tuple[str, Chunk, list[TokenLogprob] | None]:
    parts: list[str] = []
    tokens: list[TokenLogprob] | None = None
    async for c in gen:
        parts.append(c.text)
        if c.logprobs is not None:
            tokens = (tokens or []) + c.logprobs
        if c.finish_reason is not None:
            return "".join(parts), c, tokens
    raise EngineError("generation ended without a finish reason")


def _with_system_note(messages: list[dict[str, Any]], note: str) -> list[dict[str, Any]]:
    """The tools' description for a template that cannot render `tools`: in the system message."""
    if messages and messages[0]["role"] in ("system", "developer"):
        first = dict(messages[0])
        first["content"] = f"{first['content']}\n\n{note}" if first["content"] else note
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


async def _tokenize(fn: Callable[[], list[int]], size: int) -> list[int]:
    """Tokenize inline when short; long prompts go to a worker thread so the event loop keeps streaming."""
    if size < _INLINE_TOKENIZE_CHARS:
        return fn()
    return await asyncio.to_thread(fn)


def _engine_error(e: EngineError) -> OpenAIError:
    """A request the engine ended: 503 `shutting_down` when the node stopped (another node can answer it), else a
    500 `engine_error`."""
    if isinstance(e, EngineClosedError):
        return OpenAIError(503, str(e), type="server_error", code="shutting_down")
    return OpenAIError(500, str(e), type="server_error", code="engine_error")
