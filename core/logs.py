"""Structured logging: one JSON object per line, with the request id bound where there is one."""

from __future__ import annotations

import logging
import sys

import msgspec
import structlog

__all__ = ["configure_logging", "get_logger"]

_encode = msgspec.json.Encoder(enc_hook=repr).encode  # what JSON cannot hold is logged as its repr


def _dumps(obj: object, **_: object) -> str:
    return _encode(obj).decode()


class _CurrentStderr:
    """`sys.stderr` as it is when a line is written, not when logging was configured: whoever swaps it (a daemon's
    redirect, a test runner's capture, which closes its stream afterwards) gets the lines, and a line is never
    written to a stream that has since been closed."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Configure structlog (and route stdlib logging through the same output) once per process."""
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer(serializer=_dumps) if fmt == "json" else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,  # True would hide logs from structlog.testing.capture_logs in tests
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
