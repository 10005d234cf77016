"""`gateway.cascade`: a first tier whose answer the gateway cannot read, or that is a backend's error, is escalated,
never answered with a 500 (the OpenAI SDK path through a gateway in process; tests/integration/test_cascade.py runs
real llama.cpp nodes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.support.inprocess import in_process
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

KEYS = KeyRing.from_inline("key-alpha-1=alpha:normal")
AUTH = {"Authorization": "Bearer key-alpha-1"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

# What a broken first tier sends: a JSON answer, or a stream's first event.
MALFORMED = {
    "not-json": b"<html>oops</html>",
    "json-array": b"[1, 2]",
    "bad-usage": (b'{"choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}], '
                  b'"usage": {"prompt_tokens": "abc", "completion_tokens": 1}}'),
    "choices-not-a-list": b'{"choices": 7}',
    "error-object": b'{"error": {"message": "the engine failed", "type": "server_error"}}',
}


def _broken(answer: bytes) -> web.Application:
    """A backend that sends `answer` as its JSON body, or as the first event of its stream."""
    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.Response(body=answer, content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + answer + b"\n\ndata: [DONE]\n\n")
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "slots": 4, "busy": 0, "queued": 0})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", health)
    return app


def _policy(path: Path, edge: str, cloud: str) -> Path:
    path.write_text(f"""
version: 1
defaults:
  cache: {{enabled: false}}
  timeouts: {{connect_s: 1, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"]}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {{min_token_logprob: -100}}
""")
    return path


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_first_tier_answer_that_cannot_be_read_is_escalated(tmp_path: Path, case: str, stream: bool) -> None:
    with aiohttp_server(_broken(MALFORMED[case])) as edge, aiohttp_server(make_app(4, model="cloud")) as cloud:
        policy = _policy(tmp_path / "p.yaml", edge.url, cloud.url)

        async def run() -> Any:
            async with in_process(Settings(policy=policy, embedder=None, redis_url=None), KEYS) as c:
                return await c.post("/v1/chat/completions", json={**CHAT, "stream": stream}, headers=AUTH)

        r = asyncio.run(run())
    assert r.status_code == 200, r.text
    assert (r.headers["x-tiergate-tier"], r.headers["x-tiergate-cascade"]) == ("cloud", "escalated")
    # An error event before the first token is the stream reader's to catch: the first tier failed outright.
    expected = "first_tier_failed" if (case, stream) == ("error-object", True) else "malformed_answer"
    assert r.headers["x-tiergate-cascade-reason"] == expected
    assert "w0" in r.text and "oops" not in r.text and "engine failed" not in r.text  # the cloud's answer only
