"""HTTP plumbing every OpenAI-compatible server of the project shares: the bounded body reader, SSE framing,
and an `OpenAIError` as a response.

The gateway and the edge node both read request bodies through `read_body`, so a body over the limit is a 413
as soon as it is known to be too large (declared, or counted while it arrives), never buffered whole first.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive

from tiergate.core.errors import OpenAIError

__all__ = ["DONE", "error_response", "read_body", "replay", "sse"]

DONE = b"data: [DONE]\n\n"


def sse(payload: bytes) -> bytes:
    """One server-sent event carrying `payload` (a JSON chunk)."""
    return b"data: " + payload + b"\n\n"


BODY_TIMEOUT_S = 30.0


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The whole body, or a 413 `body_too_large` once its declared or counted size passes `limit` bytes, or a 408
    `body_timeout` when it has not all arrived within `timeout_s` (a client trickling its body would otherwise hold
    its connection and its tenant's slot for as long as it likes).

    A client that leaves while sending raises Starlette's ClientDisconnect."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise OpenAIError(413, f"Request body is {declared} bytes; the limit is {limit}.", code="body_too_large")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise OpenAIError(413, f"Request body exceeds the limit of {limit} bytes.",
                                      code="body_too_large")
                chunks.append(chunk)
    except TimeoutError:
        raise OpenAIError(408, f"The request body did not arrive within {timeout_s:g} s.",
                          code="body_timeout") from None
    return b"".join(chunks)


def error_response(exc: OpenAIError, headers: dict[str, str] | None = None) -> Response:
    """The error as an HTTP response in the OpenAI format, with its own headers (Retry-After) and `headers`."""
    return Response(exc.to_json(), status_code=exc.status, media_type="application/json",
                    headers={**exc.headers, **headers} if headers else exc.headers)


def replay(body: bytes, then: Receive) -> Receive:
    """An ASGI `receive` that gives `body` (already read, whole) as the request's body, then is `then`: a request
    read once can be handed on with its body, and its client's disconnect is still seen."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive
