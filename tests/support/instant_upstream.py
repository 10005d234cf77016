"""A minimal, instant OpenAI-compatible backend (aiohttp), so that what is measured is the gateway's own cost.

Also the test suite's stand-in at the HTTP boundary: a `mode` makes it fail in the ways real backends do
(HTTP 500, a stream cut short, silence, a stream stalling after its first events, a 400 verdict on the request,
a 401 from a backend configured with another key). The `role_*` modes open a chat stream as vLLM and llama.cpp
servers do, with a role-only frame before any token, and then hang (`role_hang`), close the connection
(`role_cut`), send an error event (`role_error`: an engine that failed with the request still queued) or wait
for the test's `GATE` event before generating (`role_gated`); `gated` holds every request until `GATE` is set. `frozen` answers nothing at all, health checks
included, as a SIGSTOPped process does, until the mode changes (SIGCONT): then it carries on. `poison` drops the
connection of any request whose body holds `POISON`, as a server that crashes on it does, and answers the rest.

Run: python -m tests.support.instant_upstream --port 9001 [--chunks 8] [--mode ok|error500|cut|hang|stall|reject|unauthorized]
                                         [--ttft-ms 0] [--tbt-ms 0] [--echo]

`--ttft-ms` / `--tbt-ms` (default 0: instant) make every answer take a fixed, model-like time: the first token after
`ttft_ms`, each further token `tbt_ms` later (a JSON answer is sent whole once its last token is "generated").
`--echo` makes the first token name the question (`q<hash of the last message or prompt>`), so a client can tell
which request an answer was generated for (a cache benchmark checks that a hit returns the right answer).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import threading
import time

import msgspec
import uvloop
from aiohttp import web

__all__ = ["GATE", "HITS", "MODE", "OPENED", "make_app", "serve"]

MODE = web.AppKey("mode", str)  # tests flip a healthy backend into a broken one
HITS = web.AppKey("hits", int)  # completion requests answered so far
LAST_BODY = web.AppKey("last_body", bytes)  # the raw body of the latest completion request (what the gateway sent)
GATE = web.AppKey("gate", threading.Event)  # `role_gated`: generation starts once the test sets it
OPENED = web.AppKey("opened", threading.Event)  # `role_gated`: set once a role-only frame went out

_enc = msgspec.json.Encoder().encode


class _Req(msgspec.Struct):
    model: str = "instant"
    stream: bool = False
    max_tokens: int | None = None
    messages: list[dict] | None = None
    prompt: str | list[str] | None = None


_dec = msgspec.json.Decoder(_Req)


def make_app(chunks: int = 8, mode: str = "ok", model: str = "instant", slots: int = 64, *, ttft_ms: float = 0.0,
             tbt_ms: float = 0.0, echo: bool = False) -> web.Application:
    """`mode` may be changed at run time through app[MODE] (tests flip a healthy backend into a broken one).

    `ttft_ms` / `tbt_ms` add a fixed generation time (time to the first token, then between tokens); 0 is instant.
    `echo` replaces the first token by `q<12 hex digits>`, a hash of the request's last message (or prompt).
    """
    ttft_s, tbt_s = max(ttft_ms, 0.0) / 1000, max(tbt_ms, 0.0) / 1000
    app = web.Application()
    app[MODE] = mode
    app[HITS] = 0
    app[LAST_BODY] = b""
    app[GATE], app[OPENED] = threading.Event(), threading.Event()

    async def _frozen() -> None:
        while app[MODE] == "frozen":  # stopped: carries on where it was once the mode changes
            await asyncio.sleep(0.05)

    async def complete(request: web.Request) -> web.StreamResponse:
        app[HITS] += 1
        app[LAST_BODY] = raw = await request.read()
        body = _dec.decode(raw)
        chat = request.path.endswith("/chat/completions")
        m = app[MODE]
        if m == "error500":
            return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
        if m == "reject":
            return web.json_response({"error": {"message": "prompt is longer than the context (2048 tokens)",
                                                "type": "invalid_request_error", "code": "context_length_exceeded"}},
                                     status=400)
        if m == "unauthorized":
            return web.json_response({"error": {"message": "invalid API key", "type": "authentication_error"}},
                                     status=401)
        if m == "hang":
            await asyncio.sleep(3600)
        if m == "poison" and b"POISON" in raw:  # a request that kills the server: the connection just drops
            request.transport.close()
            return web.Response()
        if m == "gated":  # holds every request until the test sets GATE (a backend busy for as long as it likes)
            await asyncio.to_thread(app[GATE].wait, 60)
        await _frozen()
        n = min(chunks, body.max_tokens or chunks)
        words = [f"w{i} " for i in range(n)]
        if echo and n:
            asked = body.messages[-1] if body.messages else body.prompt
            words[0] = f"q{hashlib.sha256(_enc(asked)).hexdigest()[:12]} "
        created = int(time.time())
        finish = "length" if body.max_tokens is not None and body.max_tokens <= chunks else "stop"
        if not body.stream:
            if m == "slow":
                await asyncio.sleep(0.05 * n)  # a backend that takes time to generate
            if ttft_s or tbt_s:
                await asyncio.sleep(ttft_s + tbt_s * max(n - 1, 0))
            text = "".join(words)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish} if chat
                      else {"index": 0, "text": text, "finish_reason": finish})
            return web.Response(body=_enc({"id": "x", "object": "chat.completion" if chat else "text_completion",
                                           "created": created, "model": body.model, "choices": [choice],
                                           "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                                     "total_tokens": 5 + n}}),
                                content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if chat else "text_completion"
        if m.startswith("role_"):
            await resp.write(b"data: " + _enc({"id": "x", "object": obj, "created": created, "model": body.model,
                                                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                             "finish_reason": None}]}) + b"\n\n")
            if m == "role_hang":
                await asyncio.sleep(3600)  # queued behind other requests for ever: no slot, no prefill
            if m == "role_cut":
                request.transport.close()  # the node died with the request in its queue
                return resp
            if m == "role_error":
                await resp.write(b'data: {"error": {"message": "the engine failed", "type": "server_error", '
                                 b'"code": "engine_error", "param": null}}\n\ndata: [DONE]\n\n')
                return resp
            if m == "role_gated":
                app[OPENED].set()
                await asyncio.to_thread(app[GATE].wait, 60)
        for i in range(n):
            if m == "cut" and i == n // 2:
                request.transport.close()  # a backend dying mid-stream
                return resp
            if m == "stall" and i == 2:
                await asyncio.sleep(3600)  # a backend stuck mid-stream, connection open
            if m == "slow":
                await asyncio.sleep(0.05)
            if ttft_s and i == 0 or tbt_s and i > 0:
                await asyncio.sleep(ttft_s if i == 0 else tbt_s)
            choice = {"index": 0, "delta": {"content": words[i]}, "finish_reason": None} if chat else \
                {"index": 0, "text": words[i], "finish_reason": None}
            await resp.write(b"data: " + _enc({"id": "x", "object": obj, "created": created, "model": body.model,
                                                "choices": [choice]}) + b"\n\n")
        last = {"index": 0, "delta": {}, "finish_reason": finish} if chat else \
            {"index": 0, "text": "", "finish_reason": finish}
        await resp.write(b"data: " + _enc({"id": "x", "object": obj, "created": created, "model": body.model,
                                            "choices": [last]}) + b"\n\n")
        await resp.write(b"data: " + _enc({"id": "x", "object": obj, "created": created, "model": body.model,
                                            "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n,
                                                                     "total_tokens": 5 + n}}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(request: web.Request) -> web.Response:
        await _frozen()
        return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def health(request: web.Request) -> web.Response:
        await _frozen()
        return web.json_response({"status": "ok", "model": model, "slots": slots, "busy": 0, "queued": 0})

    async def prom(request: web.Request) -> web.Response:
        """Enough of vLLM's /metrics for a cloud pool to read load from."""
        await _frozen()
        lines = []
        for name, kind in (("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                           ("vllm:kv_cache_usage_perc", "gauge")):
            lines += [f"# HELP {name} instant backend", f"# TYPE {name} {kind}", f'{name}{{model_name="{model}"}} 0.0']
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app.router.add_get("/metrics", prom)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/v1/completions", complete)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    return app


def serve(port: int, chunks: int = 8, mode: str = "ok", ttft_ms: float = 0.0, tbt_ms: float = 0.0,
          echo: bool = False) -> None:
    uvloop.install()
    web.run_app(make_app(chunks, mode, ttft_ms=ttft_ms, tbt_ms=tbt_ms, echo=echo), host="127.0.0.1", port=port,
                access_log=None, print=None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=9001)
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--mode", default="ok")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="fixed time to the first token (default: instant)")
    ap.add_argument("--tbt-ms", type=float, default=0.0, help="fixed time between tokens (default: instant)")
    ap.add_argument("--echo", action="store_true", help="first token: a hash of the question (default: w0)")
    a = ap.parse_args()
    serve(a.port, a.chunks, a.mode, a.ttft_ms, a.tbt_ms, a.echo)
