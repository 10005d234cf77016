"""A pooled client for OpenAI-compatible backends (edge nodes and vLLM servers alike).

One aiohttp session per gateway process keeps connections alive across requests: httpx costs several
times more CPU per request, and the gateway's own overhead budget is about a millisecond.
Timeouts are per phase (connect, first byte, between chunks, total) so a stuck backend is noticed
quickly without cutting off a long but healthy generation. Closing a response closes its connection,
which is how a client's disconnect stops the generation upstream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from gateway.pool import Endpoint
from policies.types import Timeouts

__all__ = ["MAX_EVENT_BYTES", "UpstreamClient", "UpstreamFailure", "UpstreamResponse"]

# One SSE line longer than this is a broken backend, not a chunk of an answer: refuse it rather than buffer it.
MAX_EVENT_BYTES = 8 * 1024 * 1024


class UpstreamFailure(Exception):
    """A backend did not give a usable answer.

    `retryable` is true when nothing reached the client yet and another endpoint may do better
    (connection refused, timeout before the first byte, 5xx); `status` is what the client gets if
    every attempt fails this way.
    """

    def __init__(self, message: str, *, kind: str, status: int = 502, retryable: bool = True,
                 body: bytes | None = None) -> None:
        super().__init__(message)
        self.kind = kind  # connect | timeout | http_5xx | http_4xx | protocol | stream
        self.status = status
        self.retryable = retryable
        self.body = body


@dataclass(slots=True)
class UpstreamResponse:
    """An open upstream response; the caller must `close()` it (streams: when done or cancelled)."""

    endpoint: Endpoint
    _resp: aiohttp.ClientResponse
    _timeouts: Timeouts

    @property
    def status(self) -> int:
        return self._resp.status

    async def read(self) -> bytes:
        """The whole body, bounded by the first-byte timeout (a non-streaming answer arrives at once)."""
        try:
            async with asyncio.timeout(self._timeouts.first_byte_s):
                return await self._resp.read()
        except TimeoutError:
            raise UpstreamFailure(f"{self.endpoint.id} timed out after {self._timeouts.first_byte_s:g}s",
                                  kind="timeout", status=504) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(f"{self.endpoint.id} broke off the answer: {exc}", kind="protocol") from None

    async def events(self) -> AsyncIterator[list[bytes]]:
        """Yield the SSE `data:` payloads (without the prefix) in batches: every complete event received so far.

        A batch is what one read of the socket completed, so a fast backend's events go on to the client in
        one write rather than one each. The stream's last batch ends with the payload `[DONE]`; a stream that
        closes without it raises UpstreamFailure. The first batch may take up to the first-byte timeout,
        each later one the between-chunks timeout.
        """
        loop = asyncio.get_running_loop()
        between = self._timeouts.between_chunks_s
        content = self._resp.content
        buf = bytearray()
        try:
            async with asyncio.timeout(self._timeouts.first_byte_s) as deadline:
                while True:
                    chunk = await content.readany()
                    if not chunk:
                        raise UpstreamFailure(f"{self.endpoint.id} closed the stream before [DONE]", kind="stream")
                    buf += chunk
                    end = buf.rfind(b"\n")
                    if end < 0:
                        if len(buf) > MAX_EVENT_BYTES:
                            raise UpstreamFailure(f"{self.endpoint.id} sent an event over {MAX_EVENT_BYTES} bytes",
                                                  kind="protocol")
                        continue
                    lines = bytes(buf[:end]).split(b"\n")
                    del buf[:end + 1]
                    batch = []
                    for line in lines:
                        if line.startswith(b"data:"):  # not blank separators, comments, `event:` lines
                            payload = line[5:].strip()
                            batch.append(payload)
                            if payload == b"[DONE]":
                                yield batch
                                return
                    if batch:
                        deadline.reschedule(loop.time() + between)
                        yield batch
        except TimeoutError:
            raise UpstreamFailure(f"{self.endpoint.id} went silent mid-stream", kind="timeout", status=504) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(f"{self.endpoint.id} broke off the stream: {exc}", kind="stream") from None

    def close(self) -> None:
        self._resp.close()

    def release(self) -> None:
        """Return a fully read connection to the pool."""
        self._resp.release()


class UpstreamClient:
    def __init__(self, *, max_connections: int = 1000) -> None:
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                         keepalive_timeout=30, ttl_dns_cache=10, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                              skip_auto_headers=("User-Agent",), timeout=aiohttp.ClientTimeout())

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient.start() was not called")
        return self._session

    async def post(self, endpoint: Endpoint, path: str, body: bytes, timeouts: Timeouts,
                   request_id: str) -> UpstreamResponse:
        """Send a request and wait for the response headers; non-2xx answers raise UpstreamFailure."""
        url = endpoint.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeouts.total_s, sock_connect=timeouts.connect_s)
        headers = {"content-type": "application/json", "x-request-id": request_id}
        try:
            async with asyncio.timeout(timeouts.connect_s + timeouts.first_byte_s):
                resp = await self.session.post(url, data=body, headers=headers, timeout=timeout)
        except TimeoutError:
            raise UpstreamFailure(f"{endpoint.id} did not answer within "
                                  f"{timeouts.connect_s + timeouts.first_byte_s:g}s", kind="timeout", status=504) from None
        except aiohttp.ClientConnectorError as exc:
            raise UpstreamFailure(f"cannot connect to {endpoint.id}: {exc.os_error or exc}", kind="connect",
                                  status=503) from None
        except aiohttp.ClientError as exc:
            raise UpstreamFailure(f"{endpoint.id} failed: {exc}", kind="protocol") from None
        if resp.status >= 400:
            try:
                async with asyncio.timeout(timeouts.first_byte_s):
                    err_body = await resp.read()
            except (TimeoutError, aiohttp.ClientError):
                err_body = b""
            finally:
                resp.release()
            server_error = resp.status >= 500 or resp.status == 429
            raise UpstreamFailure(f"{endpoint.id} answered HTTP {resp.status}",
                                  kind="http_5xx" if server_error else "http_4xx",
                                  status=502 if server_error else resp.status, retryable=server_error, body=err_body)
        return UpstreamResponse(endpoint, resp, timeouts)

    async def get(self, url: str, timeout_s: float) -> tuple[int, bytes]:
        """Small GETs for health and metrics polling."""
        async with asyncio.timeout(timeout_s):
            async with self.session.get(url) as resp:
                return resp.status, await resp.read()
