"""The upstream client's SSE reader, against a real aiohttp server that writes awkwardly split streams."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from core.pool import Endpoint
from core.types import Timeouts
from gateway import upstream
from gateway.upstream import UpstreamClient, UpstreamFailure
from tests.support.servers import aiohttp_server


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


_TIMEOUTS = Timeouts(first_byte_s=5, between_chunks_s=5)


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
