"""The upstream client's SSE reader, against a real aiohttp server that writes awkwardly split streams."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from tests.support.servers import aiohttp_server
from tiergate.core.pool import Endpoint
from tiergate.core.types import Timeouts
from tiergate.gateway import upstream
from tiergate.gateway.upstream import UpstreamClient, UpstreamFailure


def _server(segments: list[bytes], pause_s: float = 0.02, close_early: bool = False) -> web.Application:
    """A backend that writes `segments` one by one, pausing between them so each arrives in its own read."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for seg in segments:
            await resp.write(seg)
            await asyncio.sleep(pause_s)
        if close_early:
            request.transport.close()
            return resp
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


_TIMEOUTS = Timeouts(connect_s=30, first_byte_s=30, between_chunks_s=30)  # a busy machine is not a slow server


async def _batches(url: str, timeouts: Timeouts = _TIMEOUTS) -> list[list[bytes]]:
    client = UpstreamClient()
    await client.start()
    try:
        resp = await client.post(Endpoint("e", url, "m", "edge"), "/v1/chat/completions", b"{}", timeouts, "rid")
        try:
            return [batch async for batch in resp.events()]
        finally:
            resp.close()
    finally:
        await client.close()


def test_events_split_mid_line_with_crlf_comments_and_event_lines():
    segments = [b": keep-alive comment\r\n\r\n", b"event: message\r\ndata: {\"a\"", b": 1}\r\n\r\nda",
                b"ta: {\"b\": 2}\n\n", b"data:{\"c\": 3}\n\n", b"data: [DONE]\n\n"]
    with aiohttp_server(_server(segments)) as srv:
        batches = asyncio.run(_batches(srv.url))
    assert [p for b in batches for p in b] == [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b"[DONE]"]
    assert batches[-1][-1] == b"[DONE]"


def test_events_already_received_come_as_one_batch_and_nothing_after_done():
    one_write = b"".join(b"data: {\"i\": %d}\n\n" % i for i in range(5)) + b"data: [DONE]\n\ndata: {\"late\": 1}\n\n"
    with aiohttp_server(_server([one_write])) as srv:
        batches = asyncio.run(_batches(srv.url))
    assert batches == [[b'{"i": %d}' % i for i in range(5)] + [b"[DONE]"]]


def test_a_stream_closed_before_done_is_a_stream_failure():
    with aiohttp_server(_server([b"data: {\"a\": 1}\n\n"], close_early=True)) as srv, \
            pytest.raises(UpstreamFailure) as info:
        asyncio.run(_batches(srv.url))
    assert info.value.kind == "stream"


def test_an_endless_line_is_refused_not_buffered(monkeypatch):
    monkeypatch.setattr(upstream, "MAX_EVENT_BYTES", 1000)
    with aiohttp_server(_server([b"data: " + b"x" * 600, b"y" * 600, b"\n\ndata: [DONE]\n\n"])) as srv, \
            pytest.raises(UpstreamFailure) as info:
        asyncio.run(_batches(srv.url))
    assert info.value.kind == "protocol"


def test_silence_between_events_times_out():
    segments = [b"data: {\"a\": 1}\n\n", b"data: [DONE]\n\n"]
    with aiohttp_server(_server(segments, pause_s=1.0)) as srv, pytest.raises(UpstreamFailure) as info:
        asyncio.run(_batches(srv.url, Timeouts(first_byte_s=5, between_chunks_s=0.2)))
    assert info.value.kind == "timeout" and info.value.status == 504


_ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
_TOKEN = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'


def test_role_only_frames_are_held_and_come_with_the_first_token():
    segments = [_ROLE, b": keep-alive\n\n", _ROLE, _TOKEN, _TOKEN, b"data: [DONE]\n\n"]
    with aiohttp_server(_server(segments)) as srv:
        batches = asyncio.run(_batches(srv.url))
    assert batches[0] == [_ROLE[6:-2], _ROLE[6:-2], _TOKEN[6:-2]]  # nothing yielded before the first token
    assert [p for b in batches[1:] for p in b] == [_TOKEN[6:-2], b"[DONE]"]


def test_the_first_byte_deadline_runs_to_the_first_token_across_role_frames():
    # Role frames keep arriving (well within between-chunks), yet no token comes within the first-byte time.
    segments = [_ROLE] * 40 + [_TOKEN, b"data: [DONE]\n\n"]
    with aiohttp_server(_server(segments, pause_s=0.05)) as srv, pytest.raises(UpstreamFailure) as info:
        asyncio.run(_batches(srv.url, Timeouts(first_byte_s=0.5, between_chunks_s=5)))
    assert info.value.kind == "timeout" and info.value.retryable and "before its first token" in str(info.value)


def test_an_error_event_before_the_first_token_is_a_retryable_failure_after_it_a_payload():
    error = b'data: {"error":{"message":"the engine failed","type":"server_error","code":"engine_error"}}\n\n'
    with aiohttp_server(_server([_ROLE, error, b"data: [DONE]\n\n"])) as srv, pytest.raises(UpstreamFailure) as info:
        asyncio.run(_batches(srv.url))
    assert info.value.kind == "stream" and info.value.retryable and "engine failed" in str(info.value)
    with aiohttp_server(_server([_ROLE, _TOKEN, error, b"data: [DONE]\n\n"])) as srv:
        payloads = [p for b in asyncio.run(_batches(srv.url)) for p in b]
    assert payloads[-2:] == [error[6:-2], b"[DONE]"]  # mid-stream: the relay's to pass on


@pytest.mark.parametrize("payload, opens", [
    (b'{"choices":[{"delta":{"role":"assistant","content":""}}]}', None),
    (b'{"choices":[{"delta":{}}]}', None),
    (b'{"choices":[]}', None),
    (b'{"choices":[{"delta":{"content":"x"}}]}', True),
    (b'{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f"}}]}}]}', True),
    (b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}', True),
    (b'{"choices":[{"delta":{"refusal":"no"}}]}', True),
    (b'{"choices":[{"text":"x"}]}', True),
    (b'{"choices":[{"text":""}]}', None),
    (b'{"choices":[{"delta":{},"finish_reason":"stop"}]}', True),  # an empty answer is an answer
    (b'{"choices":[],"usage":{"completion_tokens":0}}', True),
    (b'{"error":{"message":"x"}}', False),
    (b"[DONE]", True),
    (b'{"a": 1}', True),  # not an OpenAI chunk: the backend's own, relayed
    (b"not json \xff", True),
])
def test_what_opens_an_answer(payload, opens):
    assert upstream.opens_answer(payload) is opens


async def _whole(url: str) -> bytes:
    client = UpstreamClient()
    await client.start()
    try:
        resp = await client.post(Endpoint("e", url, "m", "edge"), "/v1/chat/completions", b"{}", _TIMEOUTS, "rid",
                                 stream=False)
        try:
            return await resp.read()
        finally:
            resp.close()
    finally:
        await client.close()


def test_a_json_answer_past_the_size_limit_is_refused_not_buffered(monkeypatch):
    """Declared (content-length) or not (chunked), an answer past the limit fails as the backend's fault."""
    monkeypatch.setattr(upstream, "MAX_ANSWER_BYTES", 1000)
    body = b'{"choices": [], "pad": "' + b"x" * 2000 + b'"}'
    with aiohttp_server(_server([body])) as chunked, pytest.raises(UpstreamFailure) as info:
        asyncio.run(_whole(chunked.url))
    assert info.value.kind == "protocol" and "larger than 1000 bytes" in str(info.value)
    assert not info.value.retryable

    def declared() -> web.Application:
        async def answer(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/chat/completions", answer)
        return app

    with aiohttp_server(declared()) as srv, pytest.raises(UpstreamFailure) as info:
        asyncio.run(_whole(srv.url))
    assert "larger than 1000 bytes" in str(info.value)
    monkeypatch.setattr(upstream, "MAX_ANSWER_BYTES", 10_000)
    with aiohttp_server(declared()) as srv:
        assert asyncio.run(_whole(srv.url)) == body  # under the limit: whole
