"""`gateway.relay`: what a backend says is relayed honestly: its error in a 200 is an error and never cached, a
stream with an error frame is not a whole answer whatever follows it, and its 4xx keeps the field it named."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from tests.gateway.conftest import write_policy
from tests.support.fixed_backend import fixed_backend
from tests.support.inprocess import in_process
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.relay import _without_null_usage
from tiergate.gateway.settings import Settings

KEYS = KeyRing.from_inline("key-alpha-1=alpha:normal")
AUTH = {"Authorization": "Bearer key-alpha-1"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 0}
_ERROR = b'{"error": {"message": "the engine failed", "type": "server_error", "code": "engine_error"}}'
_CHUNK = b'{"id": "x", "object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, %s}]}'


def _twice(tmp_path: Path, backend: web.Application, body: dict[str, Any]) -> list[Any]:
    """The same request twice through a gateway (exact cache on) whose only tier is `backend`."""
    with aiohttp_server(backend) as edge, aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = write_policy(tmp_path / "p.yaml", [edge.url], [cloud.url], fallback=False)

        async def run() -> list[Any]:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                return [await c.post("/v1/chat/completions", json=body, headers=AUTH) for _ in range(2)]

        return asyncio.run(run())


def test_a_200_that_holds_an_error_is_an_error_and_is_not_cached(tmp_path: Path) -> None:
    first, second = _twice(tmp_path, fixed_backend(_ERROR, []), CHAT)
    for r in (first, second):
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
        assert "the engine failed" in r.json()["error"]["message"]


def test_a_stream_with_an_error_frame_is_not_cached_whatever_follows_it(tmp_path: Path) -> None:
    frames = [_CHUNK % b'"delta": {"content": "half an answer"}, "finish_reason": null', _ERROR,
              _CHUNK % b'"delta": {}, "finish_reason": "stop"']
    first, second = _twice(tmp_path, fixed_backend(b"{}", frames), {**CHAT, "stream": True})
    assert "the engine failed" in first.text and first.text.endswith("data: [DONE]\n\n")  # relayed as it came
    assert second.headers["x-tiergate-cache"] == "miss"  # never replayed as a whole answer


def test_a_backends_verdict_keeps_the_field_it_named(tmp_path: Path) -> None:
    verdict = (b'{"error": {"message": "temperature must be at most 2", "type": "invalid_request_error", '
               b'"code": "invalid_value", "param": "temperature"}}')
    r, _ = _twice(tmp_path, fixed_backend(verdict, [], status=400), CHAT)
    assert r.status_code == 400
    assert {k: r.json()["error"][k] for k in ("code", "param")} == {"code": "invalid_value", "param": "temperature"}


def test_a_null_usage_is_taken_out_of_each_chunk_for_a_client_that_did_not_ask() -> None:
    assert _without_null_usage(b'{"id":"c","choices":[{"index":0}],"usage":null}') == b'{"id":"c","choices":[{"index":0}]}'
    assert msgspec.json.decode(_without_null_usage(b'{"usage": null, "choices": [{"delta": {"content": "usage"}}]}')) \
        == {"choices": [{"delta": {"content": "usage"}}]}
    for kept in (b'{"choices":[{"delta":{"content":"\\"usage\\":null"}}]}', b'{"choices":[],"usage":{"a":1}}',
                 b"not json"):
        assert _without_null_usage(kept) == kept
