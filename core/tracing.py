"""Tracing with OpenTelemetry: spans across the gateway and the edge node, W3C `traceparent` between them.

Off unless configured, at no cost on the request path: `span(name)` then returns one shared no-op object (a flag
test and a call, measured in docs/benchmarks.md). `configure(service)` turns it on from the environment:

    TIERGATE_OTLP_ENDPOINT=http://collector:4318/v1/traces  (or OpenTelemetry's OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
                                                            / OTEL_EXPORTER_OTLP_ENDPOINT): OTLP over HTTP, batched
    TIERGATE_TRACES_FILE=/path/spans.jsonl                  one JSON object per finished span (local use, tests)
    OTEL_SDK_DISABLED=true                                  off whatever else is set

Like logging, tracing is configured once per process (OpenTelemetry's provider is process-wide). A server's
`TracingMiddleware` starts the root span of each request, continuing the caller's trace when the request carries a
`traceparent`, binds the trace id to every log line of the request (structlog context), and ends the span once the
whole response (a stream included) has gone out. Spans started anywhere below it nest under it; `inject` puts the
current span's `traceparent` on an outgoing request (vLLM and edge nodes continue the trace).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog

__all__ = ["NULL", "TracingMiddleware", "configure", "enabled", "inject", "record_span", "shutdown", "span", "start"]

Scope = MutableMapping[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class _NullSpan:
    """What `span()` gives when tracing is off: a context manager and a span that do nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: object) -> None:
        pass

    def set_attributes(self, attributes: dict[str, object]) -> None:
        pass

    def end(self) -> None:
        pass


NULL = _NullSpan()


class _Tracing:
    """The process's tracer and propagator once `configure` turned tracing on (None attributes: off)."""

    __slots__ = ("propagator", "provider", "tracer")

    def __init__(self) -> None:
        self.tracer: Any = None
        self.provider: Any = None
        self.propagator: Any = None


_on = _Tracing()  # process-wide, like the logging configuration; set by `configure` only


def enabled() -> bool:
    return _on.tracer is not None


def span(name: str, **attributes: object) -> Any:
    """A child span of the current one, as a context manager (`with span("classify") as s: ...`); no-op when off."""
    tracer = _on.tracer
    if tracer is None:
        return NULL
    return tracer.start_as_current_span(name, attributes=attributes or None)


def start(name: str, **attributes: object) -> Any:
    """A child span of the current one that is not made current: the caller must `end()` it (NULL when off)."""
    tracer = _on.tracer
    if tracer is None:
        return NULL
    return tracer.start_span(name, attributes=attributes or None)


def inject(headers: dict[str, str]) -> None:
    """Add the current span's `traceparent` (and `tracestate`) to an outgoing request's headers."""
    if _on.propagator is not None:
        _on.propagator.inject(headers)


def record_span(name: str, start_monotonic: float, end_monotonic: float, **attributes: object) -> None:
    """A finished child span of the current one from two `time.monotonic()` readings (work timed elsewhere, e.g.
    on the edge node's decode thread)."""
    tracer = _on.tracer
    if tracer is None or end_monotonic < start_monotonic:
        return
    offset = time.time_ns() - time.monotonic_ns()
    s = tracer.start_span(name, start_time=int(start_monotonic * 1e9) + offset, attributes=attributes or None)
    s.end(end_time=int(end_monotonic * 1e9) + offset)


def configure(service: str, environ: MutableMapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process when the environment says where spans go; returns whether it is on."""
    env = os.environ if environ is None else environ
    if _on.tracer is not None:
        return True  # once per process
    if env.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    endpoint = (env.get("TIERGATE_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or _traces_url(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")))
    path = env.get("TIERGATE_TRACES_FILE")
    if not endpoint and not path:
        return False
    # The SDK is imported only when tracing is on: start-up time (and an optional dependency) when it is off.
    from opentelemetry.sdk.resources import Resource  # optional dependency, see above
    from opentelemetry.sdk.trace import TracerProvider  # optional dependency, see above
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # optional dependency, see above
    from opentelemetry.trace.propagation import tracecontext  # optional dependency, see above

    provider = TracerProvider(resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or service}))
    if endpoint:
        # Optional dependency: the OTLP exporter (protobuf over HTTP).
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    if path:  # batched too, written within half a second
        provider.add_span_processor(BatchSpanProcessor(  # duck-typed: the SDK (and its base class) is optional
            _JsonLinesExporter(path), schedule_delay_millis=500))  # type: ignore[arg-type]
    _on.provider, _on.propagator = provider, tracecontext.TraceContextTextMapPropagator()
    _on.tracer = provider.get_tracer("tiergate")
    structlog.get_logger("tiergate.tracing").info("tracing_on", service=service, otlp=endpoint, file=path)
    return True


def shutdown() -> None:
    """Flush and stop the exporters (at process exit)."""
    provider = _on.provider
    if provider is not None:
        _on.tracer = _on.propagator = _on.provider = None
        provider.shutdown()


def _traces_url(base: str | None) -> str | None:
    return base.rstrip("/") + "/v1/traces" if base else None


class _JsonLinesExporter:
    """A SpanExporter writing one JSON object per span: ids, parent, name, times, attributes, status."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the exporter's life
        self._lock = threading.Lock()

    def export(self, spans: Any) -> Any:
        # Optional dependency, loaded with the SDK by `configure`.
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = []
        for s in spans:
            ctx, parent = s.get_span_context(), s.parent
            lines.append(json.dumps({
                "name": s.name, "service": s.resource.attributes.get("service.name"),
                "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
                "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
                "start_ns": s.start_time, "end_ns": s.end_time, "kind": s.kind.name,
                "attributes": dict(s.attributes or {}), "status": s.status.status_code.name,
            }, default=str))
        with self._lock:
            self._file.write("".join(line + "\n" for line in lines))
            self._file.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock:
            self._file.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


class TracingMiddleware:
    """ASGI middleware: each HTTP request on `paths` is the root span of its trace on this server.

    The caller's `traceparent` is continued; the trace id is bound to the request's log lines; the span ends
    once the response has gone out (streams included), with its status. `on_end(scope, span)` may add what the
    app learnt (the edge node: its queue wait, prefill and decode).
    """

    def __init__(self, app: ASGIApp, paths: frozenset[str],
                 on_end: Callable[[Scope, Any], None] | None = None) -> None:
        self.app = app
        self._paths = paths
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        tracer = _on.tracer
        if tracer is None or scope["type"] != "http" or scope["path"] not in self._paths:
            await self.app(scope, receive, send)
            return
        # Optional dependency, loaded with the SDK by `configure`.
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in (b"traceparent", b"tracestate")}
        parent = _on.propagator.extract(carrier) if carrier else None
        status = [0]

        async def traced_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        with tracer.start_as_current_span(f"{scope['method']} {scope['path']}", context=parent,
                                          kind=SpanKind.SERVER) as root:
            trace_id = f"{root.get_span_context().trace_id:032x}"
            structlog.contextvars.bind_contextvars(trace_id=trace_id)
            try:
                await self.app(scope, receive, traced_send)
            finally:
                root.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    root.set_status(Status(StatusCode.ERROR))
                if self._on_end is not None:
                    self._on_end(scope, root)
                structlog.contextvars.unbind_contextvars("trace_id")
