"""The judges that label a cached answer right or wrong: the cache's own embedder, and an OpenAI-compatible chat
model over HTTP (a real aiohttp server here), including every way the latter can fail to give a verdict."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
from aiohttp import web

from tests.cache.helpers import fresh_metrics
from tests.support.servers import ThreadedAiohttp, aiohttp_server
from tiergate.cache.batcher import EmbeddingBatcher
from tiergate.cache.embedder import OnnxEmbedder
from tiergate.cache.judge import EmbeddingJudge, HttpJudge

pytestmark = pytest.mark.anyio

Q = "What is the capital of France?"
PARIS, PARIS_AGAIN = "Paris is the capital of France.", "The capital of France is Paris."
OFF_TOPIC = "Use a hash map to count the words."


# -- the embedding judge ---------------------------------------------------------------------------------------

@pytest.fixture
async def batcher(onnx_embedder: OnnxEmbedder) -> AsyncIterator[EmbeddingBatcher]:
    b = EmbeddingBatcher(onnx_embedder, fresh_metrics()[0], linger_ms=0)
    yield b
    await b.stop()


async def test_embedding_judge_calls_a_paraphrase_the_same_and_another_answer_not(batcher) -> None:
    judge = EmbeddingJudge(batcher)
    assert judge.threshold == 0.90
    assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
    assert await judge.same(Q, PARIS, OFF_TOPIC) is False


async def test_embedding_judge_decides_at_its_threshold(batcher) -> None:
    a, b = await batcher.embed(PARIS), await batcher.embed(OFF_TOPIC)
    cosine = float(np.dot(a.values, b.values))
    assert await EmbeddingJudge(batcher, threshold=cosine - 1e-4).same(Q, PARIS, OFF_TOPIC) is True
    assert await EmbeddingJudge(batcher, threshold=cosine + 1e-4).same(Q, PARIS, OFF_TOPIC) is False


async def test_embedding_judge_needs_no_embedding_for_blank_or_identical_answers(onnx_embedder) -> None:
    batcher = EmbeddingBatcher(onnx_embedder, fresh_metrics()[0], linger_ms=0)
    judge = EmbeddingJudge(batcher, threshold=2.0)  # unreachable: an embedding could never say "same"
    assert await judge.same(Q, "  \n", PARIS) is None
    assert await judge.same(Q, PARIS, "") is None
    assert await judge.same(Q, f"  {PARIS}\n", PARIS) is True
    assert batcher._task is None  # never started: nothing was embedded


# -- the HTTP judge --------------------------------------------------------------------------------------------

class Upstream:
    """What the judge's chat endpoint answers, and what it was sent."""

    def __init__(self) -> None:
        self.status = 200
        self.body: Any = {"choices": [{"message": {"role": "assistant", "content": "yes"}}]}
        self.raw: str | None = None
        self.requests: list[tuple[str, dict[str, str], Any]] = []
        self.hang = threading.Event()  # set: answers at once; clear: holds the request until set
        self.hang.set()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.path, dict(request.headers), await request.json()))
        await asyncio.get_running_loop().run_in_executor(None, self.hang.wait, 30)
        if self.raw is not None:
            return web.Response(status=self.status, text=self.raw, content_type="application/json")
        return web.json_response(self.body, status=self.status)


@pytest.fixture
def upstream() -> Iterator[tuple[Upstream, ThreadedAiohttp]]:
    up = Upstream()
    app = web.Application()
    app.router.add_post("/{tail:.*}", up.handle)
    try:
        with aiohttp_server(app) as server:
            yield up, server
    finally:
        up.hang.set()


def said(up: Upstream, content: Any) -> None:
    up.body = {"choices": [{"message": {"role": "assistant", "content": content}}]}


async def test_http_judge_asks_once_at_temperature_0_and_reads_yes_or_no(upstream) -> None:
    up, server = upstream
    judge = HttpJudge(server.url + "/v1", "judge-model", api_key="k-123")
    try:
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
        said(up, " No.")
        assert await judge.same(Q, OFF_TOPIC, PARIS) is False
        said(up, "Yes, A is fine")
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
    finally:
        await judge.close()
    path, headers, body = up.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer k-123"
    assert body["model"] == "judge-model" and body["temperature"] == 0 and body["max_tokens"] == 3
    [message] = body["messages"]
    assert message["role"] == "user"
    assert Q in message["content"] and PARIS in message["content"] and PARIS_AGAIN in message["content"]
    # the cached answer is "A", the fresh one "B"
    assert message["content"].index(PARIS) < message["content"].index(PARIS_AGAIN)


async def test_http_judge_takes_a_full_endpoint_url_as_is_and_sends_no_key_it_was_not_given(upstream) -> None:
    up, server = upstream
    judge = HttpJudge(server.url + "/judge/chat/completions/", "m")
    try:
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
    finally:
        await judge.close()
    path, headers, _ = up.requests[0]
    assert path == "/judge/chat/completions"
    assert "Authorization" not in headers


async def test_http_judge_cuts_long_texts_to_4000_characters(upstream) -> None:
    up, server = upstream
    judge = HttpJudge(server.url, "m")
    try:
        await judge.same("q" * 5000, "a" * 4500, "b" * 4001)
    finally:
        await judge.close()
    content = up.requests[0][2]["messages"][0]["content"]
    assert "q" * 4000 in content and "q" * 4001 not in content
    assert "a" * 4000 in content and "a" * 4001 not in content
    assert "b" * 4000 in content and "b" * 4001 not in content


@pytest.mark.parametrize("setup", [
    pytest.param(lambda up: said(up, "maybe"), id="neither-yes-nor-no"),
    pytest.param(lambda up: said(up, None), id="null-content"),
    pytest.param(lambda up: said(up, "not sure"), id="not-sure"),
    pytest.param(lambda up: setattr(up, "status", 500), id="http-500"),
    pytest.param(lambda up: setattr(up, "status", 429), id="http-429"),
    pytest.param(lambda up: setattr(up, "body", {"choices": []}), id="no-choices"),
    pytest.param(lambda up: setattr(up, "body", {"error": "x"}), id="no-choices-key"),
    pytest.param(lambda up: setattr(up, "body", ["yes"]), id="a-list"),
    pytest.param(lambda up: setattr(up, "raw", "{not json"), id="not-json"),
])
async def test_http_judge_gives_no_verdict_when_the_answer_is_unusable(upstream, setup) -> None:
    up, server = upstream
    setup(up)
    judge = HttpJudge(server.url, "m")
    try:
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is None
    finally:
        await judge.close()
    assert len(up.requests) == 1


async def test_http_judge_gives_no_verdict_when_the_endpoint_is_slow_or_gone(upstream) -> None:
    up, server = upstream
    up.hang.clear()
    judge = HttpJudge(server.url, "m", timeout_s=0.3)
    try:
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is None
        up.hang.set()
        assert await judge.same(Q, PARIS, PARIS_AGAIN) is True  # the same judge recovers
    finally:
        await judge.close()
    closed = HttpJudge("http://127.0.0.1:9", "m")  # nothing listens on the discard port
    try:
        assert await closed.same(Q, PARIS, PARIS_AGAIN) is None
    finally:
        await closed.close()


async def test_http_judge_opens_a_new_session_after_close(upstream) -> None:
    _, server = upstream
    judge = HttpJudge(server.url, "m")
    await judge.close()  # before any call: nothing to close
    assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
    await judge.close()
    assert await judge.same(Q, PARIS, PARIS_AGAIN) is True
    await judge.close()
