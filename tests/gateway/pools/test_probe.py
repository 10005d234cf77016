"""`gateway.pools.probe`: one health poll reads a vLLM server's load, checks the model it serves and its context,
and says why a server is unhealthy (`Unhealthy.kind`), against a fake server on a real socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.support.servers import aiohttp_server
from tiergate.gateway.pools.probe import Unhealthy, probe
from tiergate.gateway.pools.vllm_metrics import VllmMetrics

CAPTURE = (Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics.txt").read_text()


def _server(*, health: int = 200, metrics: tuple[int, str] = (200, CAPTURE),
            models: tuple[int, Any] = (200, {"object": "list", "data": [{"id": "m", "max_model_len": 8192}]})
            ) -> web.Application:
    app = web.Application()

    async def _health(_: web.Request) -> web.Response:
        return web.Response(status=health)

    async def _metrics(_: web.Request) -> web.Response:
        return web.Response(status=metrics[0], text=metrics[1])

    async def _models(_: web.Request) -> web.Response:
        status, body = models
        return web.json_response(body, status=status) if not isinstance(body, str) else web.Response(text=body)

    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/models", _models)
    return app


def _probe(app: web.Application, model: str | None) -> VllmMetrics:
    with aiohttp_server(app) as server:
        async def run() -> VllmMetrics:
            async with aiohttp.ClientSession() as session:
                return await probe(session, server.url, model, "cloud")

        return asyncio.run(run())


def test_a_vllm_server_gives_its_load_and_with_a_model_check_its_context() -> None:
    assert _probe(_server(), None).max_model_len is None  # no model check: /v1/models not read
    reading = _probe(_server(), "m")
    assert reading.max_model_len == 8192 and reading.kv_blocks == 32768


def test_a_context_that_is_not_a_positive_integer_is_ignored() -> None:
    for ctx in (True, 0, "8192"):
        body = {"object": "list", "data": [{"id": "m", "max_model_len": ctx}]}
        assert _probe(_server(models=(200, body)), "m").max_model_len is None


@pytest.mark.parametrize(("server", "kind", "says"), [
    (_server(health=503), "http_status", "/health answered HTTP 503"),
    (_server(metrics=(404, "")), "not_vllm", "/metrics answered HTTP 404"),
    (_server(metrics=(200, "# TYPE up gauge\nup 1\n")), "not_vllm", "not a vLLM server"),
    (_server(metrics=(200, "not prometheus {{{")), "not_vllm", "not a vLLM server"),
    (_server(models=(500, {})), "not_vllm", "/v1/models answered HTTP 500"),
    (_server(models=(200, "not json")), "not_vllm", "not an OpenAI model list"),
    (_server(models=(200, {"data": "m"})), "not_vllm", "not an OpenAI model list"),
    (_server(models=(200, {"data": [{"id": "other"}, "junk"]})), "wrong_model", "serves ['other']"),
], ids=["health", "metrics-status", "metrics-not-vllm", "metrics-not-text", "models-status", "models-not-json",
        "models-not-a-list", "wrong-model"])
def test_a_server_that_is_down_not_vllm_or_serving_another_model_is_unhealthy(server: web.Application, kind: str,
                                                                               says: str) -> None:
    with pytest.raises(Unhealthy) as caught:
        _probe(server, "m")
    assert caught.value.kind == kind and says in caught.value.reason and str(caught.value) == caught.value.reason
