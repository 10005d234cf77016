"""Route llama.cpp's C log output into structlog, and let callers watch it.

llama.cpp prints to stderr by default, in fragments (a line may arrive in several calls). The bridge
reassembles lines, logs warnings and errors through structlog (the rest at debug), remembers the last
error lines (so a failed model load can say why in one line) and feeds lines to listeners (the
quantizer's progress bar parses "[  3/ 28] blk.0.attn_q.weight ..." lines).

The C side keeps a raw pointer to our callback: the bridge object must stay alive while installed,
so it is a context manager and `close()` puts the previous logger back.
"""

from __future__ import annotations

import ctypes
import threading
from collections import deque
from collections.abc import Callable
from typing import Self

import structlog

__all__ = ["LlamaLogBridge"]

_LEVEL_WARN, _LEVEL_ERROR, _LEVEL_CONT = 3, 4, 5

log = structlog.get_logger("edge_node.llama")


class LlamaLogBridge:
    """Installs a llama.cpp log callback for as long as the object is open."""

    def __init__(self, echo_debug: bool = False) -> None:
        import llama_cpp  # optional dependency: the edge extra

        self._llama = llama_cpp
        self._echo_debug = echo_debug
        self._lock = threading.Lock()
        self._partial = ""
        self._partial_level = 2
        self._errors: deque[str] = deque(maxlen=8)
        self._listeners: list[Callable[[str], None]] = []
        # Remember the logger we replace (llama-cpp-python installs its own at import) to restore it.
        self._prev_cb = llama_cpp.llama_log_callback()
        self._prev_data = ctypes.c_void_p()
        llama_cpp.llama_log_get(ctypes.byref(self._prev_cb), ctypes.byref(self._prev_data))
        # Keep the ctypes function object referenced: llama.cpp stores only its address.
        self._callback = llama_cpp.llama_log_callback(self._on_log)
        llama_cpp.llama_log_set(self._callback, ctypes.c_void_p(0))
        self._installed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._installed:
            self._llama.llama_log_set(self._prev_cb, self._prev_data)
            self._installed = False

    def add_listener(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def last_error(self) -> str | None:
        """The most recent warning/error line llama.cpp printed, if any."""
        with self._lock:
            return self._errors[-1] if self._errors else None

    def _on_log(self, level: int, text: bytes | None, _user: object) -> None:
        # Never raise into C.
        try:
            chunk = (text or b"").decode("utf-8", errors="replace")
            with self._lock:
                if level != _LEVEL_CONT:
                    self._partial_level = level
                self._partial += chunk
                if "\n" not in self._partial:
                    return
                *lines, self._partial = self._partial.split("\n")
                level = self._partial_level
                listeners = list(self._listeners)
                if level >= _LEVEL_WARN:
                    self._errors.extend(line.strip() for line in lines if line.strip())
            for line in lines:
                line = line.rstrip()
                if not line:
                    continue
                for fn in listeners:
                    fn(line)
                if level == _LEVEL_ERROR:
                    log.error("llama.cpp", msg=line)
                elif level == _LEVEL_WARN:
                    log.warning("llama.cpp", msg=line)
                elif self._echo_debug:
                    log.debug("llama.cpp", msg=line)
        except Exception:  # noqa: BLE001, S110 - an exception must never propagate into C
            pass
