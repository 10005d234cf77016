"""Send a fuzz case as raw bytes over a socket and judge the answer.

A raw socket, not an HTTP client library: the cases carry bytes that a library would refuse to send (non-ASCII
header values, a Content-Length that lies, bodies in any encoding). Every request says `connection: close`, so the
whole answer is what arrives until the server closes.

Verdicts:
- `answered`: a final HTTP status below 500 (1xx interim answers skipped), within the timeout;
- `5xx`: a final status of 500 or more;
- `hang`: nothing complete within the timeout;
- `closed`: the connection closed (or was reset) without a status line.
An answered error is `openai` when its body is an OpenAI error object, `plain` otherwise (uvicorn's own answer
to a request it cannot parse as HTTP: `Invalid HTTP request received.`); a 200 completion is `complete` when it
is a whole JSON answer with choices, or SSE ending in `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass

from tests.support.fuzz_cases import Case

__all__ = ["UVICORN_400", "Result", "send"]

UVICORN_400 = b"Invalid HTTP request received."  # uvicorn's answer to bytes that are not an HTTP request


@dataclass(frozen=True, slots=True)
class Result:
    case: Case
    verdict: str  # answered | 5xx | hang | closed
    status: int | None
    shape: str  # openai | plain | complete | incomplete | ok | none
    seconds: float
    excerpt: bytes


def _request_bytes(case: Case, host: str, port: int, rng_chunks: int = 7) -> bytes:
    request_line = case.method.encode() + b" " + case.path.encode("latin-1") + b" HTTP/1.1"
    lines = [request_line, f"host: {host}:{port}".encode(), b"connection: close"]
    names = {k.lower() for k, _ in case.headers}
    lines += [k + b": " + v for k, v in case.headers]
    body = case.body
    if case.chunked:
        lines.append(b"transfer-encoding: chunked")
        step = max(1, len(body) // rng_chunks)
        parts = [body[i:i + step] for i in range(0, len(body), step)]
        body = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    elif b"content-length" not in names and (body or case.method == "POST"):
        lines.append(f"content-length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _split(raw: bytes) -> tuple[int | None, dict[bytes, bytes], bytes]:
    """The final response's status, headers and (de-chunked) body; 1xx interim responses are skipped."""
    while raw.startswith(b"HTTP/"):
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if not sep:
            return None, {}, b""
        status_line, *header_lines = head.split(b"\r\n")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            return None, {}, b""
        if 100 <= status < 200:
            raw = rest
            continue
        headers = {}
        for line in header_lines:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            rest = _dechunk(rest)
        elif (n := headers.get(b"content-length")) is not None and n.isdigit():
            rest = rest[:int(n)]
        return status, headers, rest
    return None, {}, b""


def _dechunk(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(data):
        j = data.find(b"\r\n", i)
        if j < 0:
            break
        try:
            size = int(data[i:j].split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += data[j + 2:j + 2 + size]
        i = j + 2 + size + 2
    return bytes(out)


# The last event of a whole stream on the Messages and Responses routes.
_SURFACE_ENDS = {"/v1/messages": (b"message_stop",), "/v1/responses": (b"response.completed", b"response.incomplete"),
                 "/v1/messages/count_tokens": ()}


def _shape(case: Case, status: int, headers: dict[bytes, bytes], body: bytes) -> str:
    ctype = headers.get(b"content-type", b"")
    if status >= 400:
        try:
            err = json.loads(body)["error"]
            ok = isinstance(err, dict) and isinstance(err.get("message"), str) and isinstance(err.get("type"), str)
        except (ValueError, KeyError, TypeError):
            ok = False
        return "openai" if ok else "plain"
    if status == 200 and case.path.split("?")[0] in _SURFACE_ENDS:
        if ctype.startswith(b"text/event-stream"):  # named events, ending as a whole answer ends
            names = [ln[7:].strip() for ln in body.split(b"\n") if ln.startswith(b"event: ")]
            return "complete" if names and names[-1] in _SURFACE_ENDS[case.path.split("?")[0]] else "incomplete"
        try:
            answer = json.loads(body)
            return "complete" if "content" in answer or "output" in answer or "input_tokens" in answer \
                else "incomplete"
        except (ValueError, TypeError):
            return "incomplete"
    if status == 200 and case.path.endswith("completions"):
        if ctype.startswith(b"text/event-stream"):
            events = [ln[6:] for ln in body.split(b"\n") if ln.startswith(b"data: ")]
            return "complete" if events and events[-1].strip() == b"[DONE]" else "incomplete"
        try:
            return "complete" if json.loads(body)["choices"] else "incomplete"
        except (ValueError, KeyError, TypeError):
            return "incomplete"
    return "ok"


async def send(case: Case, host: str, port: int, timeout_s: float) -> Result:
    """Send one case and judge the answer (never raises for anything the server does)."""
    started = time.perf_counter()
    raw = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(_request_bytes(case, host, port))
                await writer.drain()
                while chunk := await reader.read(65536):
                    raw += chunk
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        status, _, _ = _split(bytes(raw))
        return Result(case, "hang", status, "none", time.perf_counter() - started, bytes(raw[:300]))
    except OSError:  # reset by the server: judged on what did arrive
        pass
    elapsed = time.perf_counter() - started
    status, headers, body = _split(bytes(raw))
    if status is None:
        return Result(case, "closed", None, "none", elapsed, bytes(raw[:300]))
    verdict = "5xx" if status >= 500 else "answered"
    return Result(case, verdict, status, _shape(case, status, headers, body), elapsed, body[:300])
