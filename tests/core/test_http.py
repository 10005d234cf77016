"""core/http: the bounded body reader, SSE framing and errors as responses, shared by the gateway and the edge node.

`read_body` must refuse a body over the limit as soon as that is known (declared, or counted while it arrives)
and never buffer it whole first; these drive it with a real Starlette `Request` over a scripted ASGI receive.
"""

from __future__ import annotations

import json

import pytest
from starlette.requests import ClientDisconnect, Request

from tiergate.core.errors import OpenAIError, rate_limited
from tiergate.core.http import DONE, error_response, read_body, replay, sse

pytestmark = pytest.mark.anyio


class _Client:
    """A POST whose body arrives in `chunks` (then, with `disconnect`, the client leaves); counts what was read."""

    def __init__(self, chunks: list[bytes], headers: dict[str, str] | None = None, disconnect: bool = False):
        self.messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1 or disconnect}
                         for i, c in enumerate(chunks)]
        if disconnect:
            self.messages.append({"type": "http.disconnect"})
        self.received = 0
        raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": raw,
                 "query_string": b""}
        self.request = Request(scope, self.receive)

    async def receive(self) -> dict:
        self.received += 1
        return self.messages.pop(0)


async def test_a_body_within_the_limit_comes_back_whole_and_in_order() -> None:
    client = _Client([b'{"a": ', b"1", b"}"])
    assert await read_body(client.request, limit=8) == b'{"a": 1}'  # exactly at the limit is allowed


async def test_an_empty_body_is_empty() -> None:
    assert await read_body(_Client([b""]).request, limit=0) == b""


async def test_a_declared_size_over_the_limit_is_a_413_before_any_of_the_body_is_read() -> None:
    client = _Client([b"x" * 100], headers={"content-length": "100"})
    with pytest.raises(OpenAIError) as info:
        await read_body(client.request, limit=99)
    assert info.value.status == 413 and info.value.code == "body_too_large"
    assert "100" in info.value.message and "99" in info.value.message
    assert client.received == 0


async def test_an_undeclared_body_is_refused_at_the_chunk_that_passes_the_limit() -> None:
    client = _Client([b"x" * 4, b"x" * 4, b"x" * 4, b"x" * 4])  # chunked: no content-length
    with pytest.raises(OpenAIError) as info:
        await read_body(client.request, limit=10)
    assert info.value.status == 413 and info.value.code == "body_too_large"
    assert client.received == 3  # the rest is never read, let alone buffered


async def test_a_body_larger_than_it_declared_is_still_counted() -> None:
    client = _Client([b"x" * 6, b"x" * 6], headers={"content-length": "5"})
    with pytest.raises(OpenAIError) as info:
        await read_body(client.request, limit=10)
    assert info.value.status == 413


async def test_a_malformed_content_length_is_not_trusted_and_the_body_is_counted() -> None:
    client = _Client([b"abc"], headers={"content-length": "lots"})
    assert await read_body(client.request, limit=3) == b"abc"


async def test_a_client_that_leaves_while_sending_raises_client_disconnect() -> None:
    client = _Client([b"part"], disconnect=True)
    with pytest.raises(ClientDisconnect):
        await read_body(client.request, limit=100)


def test_sse_frames_one_event_and_done_ends_the_stream() -> None:
    assert sse(b'{"id": 1}') == b'data: {"id": 1}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    stream = sse(b"{}") + DONE
    assert [e for e in stream.split(b"\n\n") if e] == [b"data: {}", b"data: [DONE]"]


def test_an_error_response_is_the_openai_error_object_with_its_status() -> None:
    r = error_response(OpenAIError(413, "too big", code="body_too_large", param="messages"))
    assert r.status_code == 413 and r.media_type == "application/json"
    assert json.loads(r.body) == {"error": {"message": "too big", "type": "invalid_request_error",
                                            "code": "body_too_large", "param": "messages"}}


def test_an_error_response_carries_the_errors_headers_and_the_callers() -> None:
    r = error_response(rate_limited("slow down", 2.4), headers={"x-tiergate-tier": "edge"})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "3" and r.headers["x-tiergate-tier"] == "edge"  # rounded up: never early
    assert error_response(rate_limited("slow down", 7)).headers["retry-after"] == "7"


async def test_replay_gives_the_body_once_then_the_clients_own_channel() -> None:
    later = [{"type": "http.disconnect"}]

    async def client() -> dict:
        return later.pop()

    receive = replay(b'{"a": 1}', client)
    assert await receive() == {"type": "http.request", "body": b'{"a": 1}', "more_body": False}
    assert await receive() == {"type": "http.disconnect"} and not later
