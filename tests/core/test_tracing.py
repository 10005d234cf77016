"""core/tracing: off and free unless configured; once on, spans nest, continue the caller's W3C trace, carry the
trace id into the request's log lines, and reach the exporters the environment names.

Tracing is process-wide: each test turns it on with the OpenTelemetry SDK and the JSON-lines file exporter
(TIERGATE_TRACES_FILE), reads the spans after `shutdown()` flushed them, and leaves it off.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web

from tests.support.servers import aiohttp_server
from tiergate.core import tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
Spans = Callable[[], dict[str, dict[str, Any]]]


@pytest.fixture
def spans(tmp_path: Path) -> Iterator[Spans]:
    """Tracing on into a file; the fixture's value flushes and returns the finished spans by name."""
    assert not tracing.enabled(), "another test left tracing on"
    path = tmp_path / "spans.jsonl"
    assert tracing.configure("svc-under-test", {"TIERGATE_TRACES_FILE": str(path)}) is True

    def finished() -> dict[str, dict[str, Any]]:
        tracing.shutdown()
        return {s["name"]: s for s in map(json.loads, path.read_text().splitlines())}

    yield finished
    tracing.shutdown()


def test_off_without_configuration_everything_is_a_no_op() -> None:
    assert tracing.configure("svc", {}) is False
    assert not tracing.enabled()
    with tracing.span("classify", tier="edge") as s:
        s.set_attribute("k", 1)
        s.set_attributes({"a": 2})
    assert s is tracing.NULL and tracing.start("x") is tracing.NULL  # one shared object: nothing allocated
    tracing.start("x").end()
    headers: dict[str, str] = {}
    tracing.inject(headers)
    assert headers == {}
    tracing.record_span("decode", 1.0, 2.0)
    tracing.shutdown()


def test_otel_sdk_disabled_wins_over_any_exporter(tmp_path: Path) -> None:
    env = {"OTEL_SDK_DISABLED": "TRUE", "TIERGATE_TRACES_FILE": str(tmp_path / "s.jsonl")}
    assert tracing.configure("svc", env) is False and not tracing.enabled()


def test_spans_nest_and_carry_their_attributes_and_the_service(spans: Spans) -> None:
    with tracing.span("request", route="chat") as outer:
        outer.set_attribute("tier", "edge")
        with tracing.span("classify"):
            pass
    got = spans()
    assert got["classify"]["parent_id"] == got["request"]["span_id"]
    assert got["classify"]["trace_id"] == got["request"]["trace_id"]
    assert got["request"]["parent_id"] is None
    assert got["request"]["attributes"] == {"route": "chat", "tier": "edge"}
    assert got["request"]["service"] == "svc-under-test"
    assert got["request"]["start_ns"] <= got["classify"]["start_ns"] <= got["classify"]["end_ns"]


def test_configuration_is_once_per_process(spans: Spans, tmp_path: Path) -> None:
    """A second `configure` keeps the first one's exporters and service name."""
    other = tmp_path / "other.jsonl"
    assert tracing.configure("another-service", {"TIERGATE_TRACES_FILE": str(other)}) is True
    with tracing.span("one"):
        pass
    assert spans()["one"]["service"] == "svc-under-test"
    assert not other.exists()


def test_a_started_span_is_not_current_and_ends_when_told(spans: Spans) -> None:
    with tracing.span("request"):
        upstream = tracing.start("upstream", attempt=1)
        with tracing.span("sibling"):
            pass
        upstream.end()
    got = spans()
    assert got["upstream"]["parent_id"] == got["request"]["span_id"]
    assert got["sibling"]["parent_id"] == got["request"]["span_id"]  # not under `upstream`
    assert got["upstream"]["attributes"] == {"attempt": 1}


def test_inject_puts_the_current_spans_traceparent_on_an_outgoing_request(spans: Spans) -> None:
    headers: dict[str, str] = {}
    with tracing.span("upstream"):
        tracing.inject(headers)
    s = spans()["upstream"]
    version, trace_id, parent_id, flags = headers["traceparent"].split("-")
    assert (version, trace_id, parent_id) == ("00", s["trace_id"], s["span_id"])
    assert int(flags, 16) & 1  # sampled: the next server records its part of the trace


def test_a_recorded_span_has_the_times_it_was_given_under_the_current_span(spans: Spans) -> None:
    with tracing.span("request"):
        t0 = time.monotonic()
        tracing.record_span("decode", t0 - 0.5, t0 - 0.25, tokens=8)
        tracing.record_span("backwards", t0, t0 - 1)  # an impossible interval is dropped
    got = spans()
    assert "backwards" not in got
    decode = got["decode"]
    assert decode["parent_id"] == got["request"]["span_id"] and decode["attributes"] == {"tokens": 8}
    assert decode["end_ns"] - decode["start_ns"] == pytest.approx(250_000_000, abs=2_000)
    assert decode["end_ns"] < got["request"]["start_ns"]  # half a second before, on the wall clock too


def test_after_shutdown_tracing_is_off(spans: Spans) -> None:
    spans()
    assert not tracing.enabled() and tracing.span("x") is tracing.NULL


def test_the_otlp_base_endpoint_gets_its_traces_path_and_receives_the_spans() -> None:
    received: list[tuple[str, str, bytes]] = []

    async def collect(request: web.Request) -> web.Response:
        received.append((request.path, request.content_type, await request.read()))
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/{tail:.*}", collect)
    with aiohttp_server(app) as collector:
        assert tracing.configure("svc", {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url + "/",
                                         "OTEL_SERVICE_NAME": "named-by-otel"})
        try:
            with tracing.span("exported-span"):
                pass
        finally:
            tracing.shutdown()  # flushes the batch
    assert [(path, ctype) for path, ctype, _ in received] == [("/v1/traces", "application/x-protobuf")]
    assert b"exported-span" in received[0][2] and b"named-by-otel" in received[0][2]


# -- TracingMiddleware -------------------------------------------------------------------------------------------

class _App:
    """An ASGI app that streams two body chunks, logging what trace id its log context holds meanwhile."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.trace_ids: list[str | None] = []
        self.last_sent_ns = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.trace_ids.append(structlog.contextvars.get_contextvars().get("trace_id"))
        with tracing.span("inner"):
            pass
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        self.last_sent_ns = time.time_ns()
        await send({"type": "http.response.body", "body": b"b", "more_body": False})


async def _call(mw: tracing.TracingMiddleware, path: str = "/v1/chat/completions",
                headers: list[tuple[bytes, bytes]] | None = None) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers or []}
    await mw(scope, receive, send)
    return sent


@pytest.mark.anyio
async def test_the_middleware_continues_the_callers_trace_with_a_root_span_per_request(spans: Spans) -> None:
    app = _App()
    ended: list[Any] = []
    mw = tracing.TracingMiddleware(app, frozenset({"/v1/chat/completions"}),
                                   on_end=lambda scope, root: (ended.append(scope["path"]),
                                                               root.set_attribute("queue_ms", 3)))
    sent = await _call(mw, headers=[(b"traceparent", f"00-{TRACE_ID}-{CLIENT_SPAN}-01".encode())])
    assert [m.get("body") for m in sent] == [None, b"a", b"b"]  # the response passes through unchanged
    assert app.trace_ids == [TRACE_ID]  # bound to the request's log lines...
    assert "trace_id" not in structlog.contextvars.get_contextvars()  # ...and only to them
    assert ended == ["/v1/chat/completions"]
    got = spans()
    root = got["POST /v1/chat/completions"]
    assert root["trace_id"] == TRACE_ID and root["parent_id"] == CLIENT_SPAN and root["kind"] == "SERVER"
    assert got["inner"]["parent_id"] == root["span_id"]
    assert root["attributes"] == {"http.response.status_code": 200, "queue_ms": 3}
    assert root["status"] == "UNSET"
    assert root["end_ns"] >= app.last_sent_ns  # the span covers the whole streamed response


@pytest.mark.anyio
async def test_the_middleware_starts_a_new_trace_without_a_traceparent_and_marks_5xx_errors(spans: Spans) -> None:
    mw = tracing.TracingMiddleware(_App(status=503), frozenset({"/v1/chat/completions"}))
    await _call(mw)
    root = spans()["POST /v1/chat/completions"]
    assert root["parent_id"] is None and root["trace_id"] != TRACE_ID
    assert root["status"] == "ERROR" and root["attributes"]["http.response.status_code"] == 503


@pytest.mark.anyio
async def test_the_middleware_traces_only_its_paths(spans: Spans) -> None:
    app = _App()
    mw = tracing.TracingMiddleware(app, frozenset({"/v1/chat/completions"}))
    sent = await _call(mw, path="/healthz")
    assert sent[0]["status"] == 200 and app.trace_ids == [None]
    assert set(spans()) == {"inner"}  # the app's own span, with no request span around it
