"""The edge node's HTTP app: OpenAI-compatible endpoints over the batching engine, plus what operators read.

`/v1/chat/completions` and `/v1/completions` (`edge_node.server.completions`), `/v1/models`, `/health` (slots, busy,
queued: what the gateway balances on; the LoRA adapter), Prometheus `/metrics` and `POST /admin/lora` (swap the
adapter, `edge_node.server.adapter`). Errors are OpenAI error objects everywhere. With
API keys (`ServerState.api_keys`) everything but `/health` requires one (`edge_node.server.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Scope

from tiergate.core import tracing
from tiergate.core.errors import OpenAIError, not_found
from tiergate.core.http import error_response
from tiergate.core.tracing import TracingMiddleware
from tiergate.edge_node.engine.request import ActiveRequest
from tiergate.edge_node.server.adapter import LoraSwap
from tiergate.edge_node.server.auth import ApiKeyMiddleware
from tiergate.edge_node.server.completions import Completions
from tiergate.edge_node.server.state import ServerState

__all__ = ["ServerState", "create_app"]

_json = msgspec.json.Encoder()
_JSON = "application/json"


def create_app(state: ServerState) -> Starlette:
    engine = state.engine
    completions = Completions(state)

    async def models(_request: Request) -> Response:
        return Response(_json.encode({"object": "list", "data": [{
            "id": state.model_name, "object": "model", "created": state.started, "owned_by": "tiergate-edge",
            "max_model_len": engine.ctx_per_slot,
        }]}), media_type=_JSON)

    async def health(_request: Request) -> Response:
        s = engine.stats()
        failed = engine.failure is not None
        status = "failed" if failed else "draining" if state.draining else "ok"
        body = {"status": status, "model": state.model_name, "slots": s.slots, "busy": s.busy,
                "queued": s.queued, "ctx": s.ctx_per_slot, "kv_cells_used": s.kv_cells_used,
                "kv_cells_total": s.kv_cells_total, "node_id": state.node_id,
                "lora": lora.name if (lora := engine.rt.lora_path) else None}
        if failed:
            body["error"] = engine.failure
        return Response(_json.encode(body), status_code=503 if failed or state.draining else 200, media_type=_JSON)

    async def metrics(_request: Request) -> Response:
        return Response(engine.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def hold(_request: Request) -> Response:
        parked = await asyncio.to_thread(engine.hold)
        return Response(_json.encode({"held": parked, "in_flight": engine.in_flight()}), media_type=_JSON)

    async def release(_request: Request) -> Response:
        engine.release()
        return Response(_json.encode({"held": False}), media_type=_JSON)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
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
            tracing.shutdown()  # flush the spans still batched

    middleware = [Middleware(ApiKeyMiddleware, keys=state.api_keys)] if state.api_keys else []
    if tracing.configure("tiergate-edge-node"):  # off unless the environment says where spans go
        middleware.append(Middleware(TracingMiddleware, paths=TRACED, on_end=_engine_phases))
    routes = [
        Route("/v1/chat/completions", completions.guarded(completions.chat), methods=["POST"]),
        Route("/v1/completions", completions.guarded(completions.text), methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/admin/lora", LoraSwap(state).handle, methods=["POST"]),
    ]
    if state.test_hooks:  # hold the decode loop at a known point, so a test proves an order instead of racing it
        routes += [Route("/_test/hold", hold, methods=["POST"]), Route("/_test/release", release, methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan, middleware=middleware,
                     exception_handlers={404: _not_found, 405: _method_not_allowed})


TRACED = frozenset({"/v1/chat/completions", "/v1/completions"})


def _engine_phases(scope: Scope, _root: object) -> None:
    """A traced request's time in the engine, as child spans of its root: waiting for a slot, the prefill of its
    prompt, the decoding of its answer (the decode thread's own `time.monotonic()` readings)."""
    gen = scope.get("state", {}).get("generation")  # set by Completions._submit
    req: ActiveRequest | None = getattr(gen, "_req", None)  # the engine's record of it (same package)
    if req is None:
        return
    end = time.monotonic()
    admitted, first = req.admitted_at, req.first_token_at
    tracing.record_span("queue wait", req.submitted, admitted or end)
    if admitted is not None:
        tracing.record_span("prefill", admitted, first or end, **{"tiergate.prompt_tokens": len(req.prompt),
                                                                  "tiergate.cached_tokens": req.cached})
    if first is not None:
        tracing.record_span("decode", first, end, **{"tiergate.completion_tokens": req.n_generated})


async def _not_found(request: Request, _exc: Exception) -> Response:
    return error_response(not_found(f"no route for {request.method} {request.url.path}"))


async def _method_not_allowed(request: Request, _exc: Exception) -> Response:
    return error_response(OpenAIError(405, f"method {request.method} not allowed on {request.url.path}",
                                      code="method_not_allowed"))
