"""Short llama.cpp (and libc) calls that keep the GIL.

ctypes releases the GIL around every call made through a `CDLL`, which llama-cpp-python uses for all
of its bindings. For a call of a few microseconds that is a bad trade in a server: while the engine
thread is inside C, the event-loop thread takes the GIL, and getting it back is a thread hand-off
that costs milliseconds when the CPU is oversubscribed (measured here: ~4 ms per hand-off at full CPU
pressure, more than a whole decode step of a small model). Binding the same symbols through
`ctypes.PyDLL` keeps the GIL for the duration of the call, so the engine thread releases the GIL only
where it should: inside `llama_decode`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from pathlib import Path
from types import ModuleType

__all__ = ["GilCalls"]


def _libllama_path(llama_cpp: ModuleType) -> str:
    lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    name = getattr(lib, "_name", None)  # the path llama-cpp-python gave ctypes.CDLL (a str)
    if isinstance(name, str) and name:
        return name
    if llama_cpp.__file__ is not None:  # None only for a namespace package, which llama_cpp is not
        for cand in sorted((Path(llama_cpp.__file__).parent / "lib").glob("libllama.*")):
            return str(cand)
    raise RuntimeError("cannot locate libllama next to llama_cpp")


class GilCalls:
    """The handful of per-token / per-admission calls the engine makes, bound without GIL release."""

    def __init__(self, llama_cpp: ModuleType) -> None:
        lib = ctypes.PyDLL(_libllama_path(llama_cpp))
        vp = ctypes.c_void_p
        i32 = ctypes.c_int32

        self.sampler_sample = lib.llama_sampler_sample
        self.sampler_sample.argtypes = [llama_cpp.llama_sampler_p_ctypes, vp, i32]
        self.sampler_sample.restype = i32

        self.memory_seq_rm = lib.llama_memory_seq_rm
        self.memory_seq_rm.argtypes = [vp, i32, i32, i32]
        self.memory_seq_rm.restype = ctypes.c_bool

        self.memory_seq_cp = lib.llama_memory_seq_cp
        self.memory_seq_cp.argtypes = [vp, i32, i32, i32, i32]
        self.memory_seq_cp.restype = None

        self.token_to_piece = lib.llama_token_to_piece
        self.token_to_piece.argtypes = [vp, i32, ctypes.c_char_p, i32, i32, ctypes.c_bool]
        self.token_to_piece.restype = i32

        libc = ctypes.PyDLL(ctypes.util.find_library("c") or None)
        self.write = libc.write
        self.write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        self.write.restype = ctypes.c_ssize_t
