"""`gateway.cascade`: a first tier whose answer the gateway cannot read, or that is a backend's error, is escalated,
never answered with a 500 (the OpenAI SDK path through a gateway in process; tests/integration/test_cascade.py runs
real llama.cpp nodes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import write_cascade_policy
from tests.support.fixed_backend import fixed_backend
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


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_first_tier_answer_that_cannot_be_read_is_escalated(tmp_path: Path, case: str, stream: bool) -> None:
    with aiohttp_server(fixed_backend(MALFORMED[case])) as edge, aiohttp_server(make_app(4, model="cloud")) as cloud:
        policy = write_cascade_policy(tmp_path / "p.yaml", edge.url, cloud.url, min_token_logprob=-100)

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
