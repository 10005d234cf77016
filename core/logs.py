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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,  # True would hide logs from structlog.testing.capture_logs in tests
    )
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    logger: structlog.typing.FilteringBoundLogger = structlog.get_logger(name)
    return logger
