"""The gateway application: `create_app` assembles the Starlette app around one `Gateway` and routes to it.

Where each route's work lives:
- `/v1/chat/completions`, `/v1/completions`: `gateway.pipeline.CompletionPipeline` (the request path), answered
  through `gateway.relay.Relay`, accounted by `gateway.accounting.Accounting`;
- the same two with `n > 1` or a list of prompts: `gateway.fanout.FanOut`, one pipeline request per answer;
- `/v1/messages` (Anthropic Messages), `/v1/responses` (OpenAI Responses): translated into chat requests and
  answered by that same pipeline (`gateway.surface`, `gateway.messages_api`, `gateway.responses_api`);
- `/v1/embeddings`: `gateway.embeddings.Embeddings` (the cache's embedder);
- `/v1/models`, `/v1/models/{id}`: `gateway.models`;
- CORS (TIERGATE_CORS_ORIGINS; off when unset): Starlette's `CORSMiddleware`, outermost;
- `/healthz`, `/readyz`, `/metrics` (the key `TIERGATE_METRICS_KEY`, if set; `gateway.metrics.exposition`),
  `/openapi.json`: here;
- `/v1/cache/feedback`: `gateway.feedback.CacheFeedback`; `/v1/usage`: `gateway.usage.UsageEndpoint`;
- `/admin/...` and `/edge/v1/...`: `gateway.admin`; `/dashboard...`: `gateway.status`;
- state and lifecycle: `gateway.lifecycle.Gateway`.
"""

from __future__ import annotations

import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tiergate.core import tracing
from tiergate.core.errors import OpenAIError, not_found, unauthorized
from tiergate.core.http import error_response
from tiergate.core.logs import configure_logging
from tiergate.core.tracing import TracingMiddleware
from tiergate.gateway.admin import AdminEndpoints, EdgeEndpoints
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.edge_auth import EdgeAuth
from tiergate.gateway.embeddings import Embeddings
from tiergate.gateway.fanout import FanOut
from tiergate.gateway.feedback import CacheFeedback
from tiergate.gateway.lifecycle import Gateway
from tiergate.gateway.messages_api import MessagesSurface
from tiergate.gateway.metrics import exposition
from tiergate.gateway.models import ModelCards
from tiergate.gateway.openapi import openapi_document
from tiergate.gateway.pipeline import CompletionPipeline, PipelineParts
from tiergate.gateway.pools.edge_urls import UrlPolicy
from tiergate.gateway.responses_api import ResponsesSurface
from tiergate.gateway.settings import Settings
from tiergate.gateway.status import StatusPage, StatusSource
from tiergate.gateway.surface import SurfaceEndpoint, SurfaceLimits
from tiergate.gateway.token_count import TokenCount
from tiergate.gateway.usage import UsageEndpoint

__all__ = ["create_app"]

log = structlog.get_logger("tiergate.gateway")
_JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]
# the requests that get a trace
TRACED = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"})
# CORS: keys travel in headers, never cookies, so no credentials mode; browser apps may read the answers' headers
CORS_METHODS = ["GET", "POST", "DELETE"]
CORS_EXPOSED = ["x-request-id", "x-tiergate-tier", "x-tiergate-cache", "x-tiergate-rule", "x-tiergate-cost",
                "x-tiergate-answers", "retry-after", "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens"]


def create_app(settings: Settings | None = None, *, keyring: KeyRing | None = None) -> Starlette:
    """Build the Starlette app around one Gateway; `app.state.gateway` exposes it to tests and tools."""
    settings = settings or Settings()
    configure_logging(settings.log_format, settings.log_level)
    traced = tracing.configure("tiergate-gateway")  # off unless the environment says where spans go
    gw = Gateway(settings, keyring=keyring)
    completions = CompletionPipeline(PipelineParts(
        settings=gw.settings, keyring=gw.keys, routing=gw.tiers, classifier=gw.classifier,
        limiter=gw.limiter, metrics=gw.metrics, cache=gw.shared_cache, dispatcher=gw.dispatcher, relay=gw.relay,
        settlements=gw.settlements, router=gw.router, explorations=gw.explorations))
    admin = AdminEndpoints(gw.admin, gw.policy_store, gw.shared_cache, gw.keys)
    edge = EdgeEndpoints(EdgeAuth(gw.settings.edge_secret, gw.settings.edge_token),
                         UrlPolicy(gw.settings.edge_network_list()), gw.settings.max_body_bytes, gw.tiers)
    status = StatusPage(StatusSource(admin=gw.admin, started_at=gw.started_at, stats=gw.stats, tiers=gw.tiers,
                                     history=gw.history, policy_store=gw.policy_store, draining=gw.is_draining,
                                     ready=gw.ready))
    feedback = CacheFeedback(gw.keys, gw.shared_cache)
    usage = UsageEndpoint(gw.keys, gw.budgets, lambda: gw.policy_store.current.policy)
    surface_limits = SurfaceLimits(gw.settings.max_body_bytes, gw.settings.body_timeout_s)
    messages_api = SurfaceEndpoint(MessagesSurface(), completions.handle, gw.keys, gw.settlements, surface_limits)
    responses_api = SurfaceEndpoint(ResponsesSurface(), completions.handle, gw.keys, gw.settlements, surface_limits)
    count_tokens = TokenCount(gw.keys, gw.tiers, gw.classifier, surface_limits)

    fanout = FanOut(completions.handle, completions.refuse, gw.keys.authenticate, max_body_bytes=gw.settings.max_body_bytes,
                    body_timeout_s=gw.settings.body_timeout_s, max_choices=gw.settings.max_choices)
    embeddings = Embeddings(gw.settings, gw.keys, gw.limiter, gw.metrics, gw.shared_cache, gw.budgets,
                            lambda: gw.policy_store.current.policy)
    cards = ModelCards(gw.tiers, embeddings.model_card, int(gw.started_at))

    async def chat(request: Request) -> Response:
        return await fanout.handle(request, "chat")

    async def text(request: Request) -> Response:
        return await fanout.handle(request, "text")

    async def models(request: Request) -> Response:
        gw.keys.authenticate(request.headers.get("authorization"))
        return JSONResponse({"object": "list", "data": cards.all()})

    async def model(request: Request) -> Response:
        gw.keys.authenticate(request.headers.get("authorization"))
        return JSONResponse(cards.get(request.path_params["model_id"]))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def readyz(request: Request) -> Response:
        ok, detail = gw.ready()
        if gw.cache is not None:  # informational: a cache that is down is bypassed, the gateway stays ready
            detail["cache"] = gw.cache.describe()
        return JSONResponse(detail, status_code=200 if ok else 503)

    metrics_auth = f"Bearer {settings.metrics_key}".encode() if settings.metrics_key else None

    async def metrics(request: Request) -> Response:
        if metrics_auth is not None and not hmac.compare_digest(
                request.headers.get("authorization", "").encode(), metrics_auth):
            raise unauthorized("/metrics needs `Authorization: Bearer <TIERGATE_METRICS_KEY>`.")
        return Response(exposition(gw.registry, tenant_labels=settings.metrics_tenant_labels),
                        media_type=CONTENT_TYPE_LATEST)

    async def openapi(request: Request) -> Response:
        embedder = embeddings.embedder()
        return Response(openapi_document(settings.max_choices, settings.embeddings_max_inputs,
                                         settings.embeddings_model, embedder.dim if embedder else None),
                        media_type=_JSON)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.startup()
        try:
            yield
        finally:
            await gw.shutdown()
            tracing.shutdown()  # flush the spans still batched

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/completions", text, methods=["POST"]),
        Route("/v1/messages", messages_api.handle, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens.handle, methods=["POST"]),
        Route("/v1/responses", responses_api.handle, methods=["POST"]),
        Route("/v1/models", _guarded(models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", _guarded(model), methods=["GET"]),
        Route("/v1/embeddings", embeddings.handle, methods=["POST"]),
        Route("/v1/cache/feedback", _guarded(feedback.handle), methods=["POST"]),
        Route("/v1/usage", _guarded(usage.handle), methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", _guarded(metrics), methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/edge/v1/heartbeat", _guarded(edge.heartbeat), methods=["POST"]),
        Route("/edge/v1/deregister", _guarded(edge.deregister), methods=["POST"]),
        Route("/admin/policy/reload", _guarded(admin.reload), methods=["POST"]),
        Route("/admin/cache/invalidate", _guarded(admin.invalidate_cache), methods=["POST"]),
        Route("/admin/keys/reload", _guarded(admin.reload_keys), methods=["POST"]),
        Route("/admin/keys/revoke", _guarded(admin.revoke_key), methods=["POST"]),
        Route("/admin/keys/unrevoke", _guarded(admin.unrevoke_key), methods=["POST"]),
        *status.routes(),
    ]
    middleware = [Middleware(TracingMiddleware, paths=TRACED)] if traced else []  # none at all when off
    if origins := settings.cors_origin_list():  # outermost: a preflight is answered before anything else runs
        middleware.insert(0, Middleware(CORSMiddleware, allow_origins=origins, allow_methods=CORS_METHODS,
                                        allow_headers=["*"], expose_headers=CORS_EXPOSED, max_age=600))
    app = Starlette(routes=routes, lifespan=lifespan, middleware=middleware, exception_handlers={
        404: _not_found_handler, 405: _method_handler, 500: _internal_handler})
    app.state.gateway = gw
    return app


def _guarded(handler: Handler) -> Handler:
    """A handler whose OpenAIError becomes its answer (the completion pipeline does this itself)."""

    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return error_response(exc)
        except ClientDisconnect:  # gone while sending its body: nobody to answer
            return Response(status_code=499)

    return run


async def _not_found_handler(request: Request, exc: Exception) -> Response:
    return error_response(not_found(f"No route {request.method} {request.url.path}. See /openapi.json.",
                                    code="unknown_url"))


async def _method_handler(request: Request, exc: Exception) -> Response:
    return error_response(OpenAIError(405, f"Method {request.method} is not allowed on {request.url.path}.",
                                      code="method_not_allowed"))


async def _internal_handler(request: Request, exc: Exception) -> Response:
    log.error("internal_error", path=request.url.path, exc_info=exc)
    return error_response(OpenAIError(500, "Internal error in the gateway; it has been logged.", type="server_error",
                                      code="internal_error"))
