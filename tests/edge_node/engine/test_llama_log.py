"""llama.cpp's C log routed into structlog: lines reassembled from fragments, warnings and errors remembered
(the last one explains a failed load), listeners fed, and the previous logger put back on close."""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterator

import pytest
import structlog
from structlog.testing import capture_logs

from tiergate.edge_node.engine.llama_log import LlamaLogBridge

llama_cpp = pytest.importorskip("llama_cpp")

INFO, WARN, ERROR, CONT = 2, 3, 4, 5


def current_logger() -> int | None:
    cb, data = llama_cpp.llama_log_callback(), ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(cb), ctypes.byref(data))
    return ctypes.cast(cb, ctypes.c_void_p).value


def emit(bridge: LlamaLogBridge, level: int, text: bytes | None) -> None:
    """Call the bridge as llama.cpp does: through the C function pointer it was given."""
    bridge._callback(level, text, None)


def test_a_failed_model_load_says_why_in_one_line(tmp_path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    llama_cpp.llama_backend_init()
    with LlamaLogBridge() as bridge, capture_logs() as logs:
        seen: list[str] = []
        bridge.add_listener(seen.append)
        model = llama_cpp.llama_model_load_from_file(os.fsencode(bad), llama_cpp.llama_model_default_params())
        assert not model
        reason = bridge.last_error()
    assert reason and "\n" not in reason
    assert reason in seen
    assert any(e["log_level"] in ("error", "warning") and e["msg"] == reason for e in logs)


def test_fragments_become_lines_and_continuations_keep_their_level() -> None:
    with LlamaLogBridge() as bridge, capture_logs() as logs:
        lines: list[str] = []
        bridge.add_listener(lines.append)
        emit(bridge, ERROR, b"failed to ")
        emit(bridge, CONT, b"load tensor")
        assert lines == [] and bridge.last_error() is None  # not a line yet
        emit(bridge, CONT, b" blk.0\nsecond ")
        emit(bridge, CONT, b"line\n\n")
        emit(bridge, INFO, b"loaded \xff model\n")
    assert lines == ["failed to load tensor blk.0", "second line", "loaded \ufffd model"]
    assert bridge.last_error() == "second line"
    assert [(e["log_level"], e["msg"]) for e in logs] == [("error", "failed to load tensor blk.0"),
                                                        ("error", "second line")]


@pytest.fixture
def debug_level() -> Iterator[None]:
    """Log at debug level for one test: another test may have configured the process's logging at info."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        yield
    finally:
        structlog.configure(**saved)


@pytest.mark.usefixtures("debug_level")
def test_info_lines_are_logged_only_when_asked_and_warnings_always() -> None:
    with LlamaLogBridge(echo_debug=True) as bridge, capture_logs() as logs:
        emit(bridge, INFO, b"n_ctx = 512\n")
        emit(bridge, WARN, b"slow path\n")
    assert [(e["log_level"], e["msg"]) for e in logs] == [("debug", "n_ctx = 512"), ("warning", "slow path")]
    assert bridge.last_error() == "slow path"
    with LlamaLogBridge() as quiet, capture_logs() as logs:
        emit(quiet, INFO, b"n_ctx = 512\n")
    assert logs == [] and quiet.last_error() is None


def test_a_listener_that_raises_never_reaches_c_and_removed_listeners_hear_nothing() -> None:
    with LlamaLogBridge() as bridge:
        heard: list[str] = []

        def broken(line: str) -> None:
            raise ValueError(line)

        bridge.add_listener(broken)
        emit(bridge, INFO, b"one\n")  # swallowed: an exception must not unwind into C
        bridge.remove_listener(broken)
        bridge.remove_listener(broken)  # twice: no error
        bridge.add_listener(heard.append)
        emit(bridge, INFO, b"two\n")
        emit(bridge, INFO, None)
        bridge.remove_listener(heard.append)
        emit(bridge, INFO, b"three\n")
    assert heard == ["two"]


def test_the_previous_logger_is_put_back_on_close() -> None:
    before = current_logger()
    bridge = LlamaLogBridge()
    assert current_logger() == ctypes.cast(bridge._callback, ctypes.c_void_p).value != before
    bridge.close()
    assert current_logger() == before
    bridge.close()  # closing twice changes nothing
    assert current_logger() == before
