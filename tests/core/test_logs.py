"""core/logs: one JSON object per line on stderr, with the context bound for the request (its id) on every line.

Logging is configured once per process, so each test configures it in a fresh interpreter (the tests' own
process keeps its configuration) and reads what that process wrote to stderr.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from datetime import datetime


def _stderr(code: str) -> list[str]:
    """The lines a fresh interpreter running `code` (after importing core.logs) wrote to stderr."""
    script = "import logging\nfrom tiergate.core.logs import configure_logging, get_logger\n" + textwrap.dedent(code)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""  # logs never go to stdout, which carries command output
    return r.stderr.splitlines()


def test_each_event_is_one_json_object_per_line_with_level_and_utc_time() -> None:
    lines = _stderr("""
        configure_logging()
        log = get_logger("tiergate.test")
        log.info("request", status=200, tier="edge")
        log.warning("slow", ms=1234.5)
    """)
    events = [json.loads(line) for line in lines]
    assert [(e["event"], e["level"]) for e in events] == [("request", "info"), ("slow", "warning")]
    assert events[0]["status"] == 200 and events[0]["tier"] == "edge" and events[1]["ms"] == 1234.5
    assert datetime.fromisoformat(events[0]["timestamp"]).utcoffset().total_seconds() == 0


def test_context_bound_for_a_request_is_on_every_line_until_unbound() -> None:
    lines = _stderr("""
        import structlog
        configure_logging()
        log = get_logger("tiergate.test")
        structlog.contextvars.bind_contextvars(request_id="req-1")
        log.info("first")
        log.info("second")
        structlog.contextvars.unbind_contextvars("request_id")
        log.info("after")
    """)
    assert [json.loads(line).get("request_id") for line in lines] == ["req-1", "req-1", None]


def test_the_level_filters_and_an_unknown_level_means_info() -> None:
    lines = _stderr("""
        configure_logging(level="warning")
        get_logger("t").info("hidden")
        get_logger("t").error("shown")
        configure_logging(level="chatty")
        get_logger("t").debug("hidden too")
        get_logger("t").info("shown too")
    """)
    assert [json.loads(line)["event"] for line in lines] == ["shown", "shown too"]


def test_an_exception_is_rendered_into_the_line() -> None:
    lines = _stderr("""
        configure_logging()
        try:
            raise ValueError("the cause")
        except ValueError:
            get_logger("t").exception("failed", path="/v1/x")
    """)
    (event,) = [json.loads(line) for line in lines]
    assert event["event"] == "failed" and event["level"] == "error"
    assert "ValueError: the cause" in event["exception"]


def test_a_value_json_cannot_hold_is_logged_as_its_repr_not_raised() -> None:
    """A log call must never fail the code that logs (a Path or an exception as a field)."""
    lines = _stderr("""
        from pathlib import PurePosixPath
        configure_logging()
        get_logger("t").warning("odd", file=PurePosixPath("/a/b"), error=ValueError("x"))
    """)
    (event,) = [json.loads(line) for line in lines]
    assert event["file"] == "PurePosixPath('/a/b')" and event["error"] == "ValueError('x')"


def test_stdlib_logging_goes_to_the_same_stream_from_warning_up() -> None:
    """Libraries' own loggers (uvicorn, httpx) are not lost, nor do their info lines flood the output."""
    lines = _stderr("""
        configure_logging(level="debug")
        logging.getLogger("somelib").info("chatter")
        logging.getLogger("somelib").warning("careful %s", "now")
    """)
    assert lines == ["WARNING somelib careful now"]


def test_the_console_format_is_for_people_not_json() -> None:
    lines = _stderr("""
        configure_logging(fmt="console")
        get_logger("t").info("hello", n=1)
    """)
    (line,) = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]  # without its colours
    assert "[info" in line and "hello" in line and "n=1" in line and not line.startswith("{")


def test_lines_go_to_stderr_as_it_is_when_written_never_to_a_closed_stream() -> None:
    """Configured while stderr was one stream, which is then swapped and closed (a test runner's capture does
    that): the next line goes to the current stderr instead of failing on the closed one."""
    lines = _stderr("""
        import io, sys
        real, sys.stderr = sys.stderr, io.StringIO()
        configure_logging()
        swapped = sys.stderr
        sys.stderr = real
        swapped.close()
        get_logger("tiergate.test").warning("after_the_swap")
    """)
    assert [json.loads(line)["event"] for line in lines] == ["after_the_swap"]
