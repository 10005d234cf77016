"""The engine's short llama.cpp and libc calls, bound so that they keep the GIL: the same results as
llama-cpp-python's bindings (which release it), on the real libllama and the tiny demo model."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tiergate.edge_node.engine.gilcalls import GilCalls

llama_cpp = pytest.importorskip("llama_cpp")

NAMES = ("sampler_sample", "memory_seq_rm", "memory_seq_cp", "token_to_piece", "write")


@pytest.fixture(scope="module")
def fast() -> GilCalls:
    return GilCalls(llama_cpp)


@pytest.fixture(scope="module")
def vocab(edge_model):
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(os.fsencode(edge_model.gguf), params)
    assert model
    yield llama_cpp.llama_model_get_vocab(model), llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    llama_cpp.llama_model_free(model)


def test_every_call_keeps_the_gil(fast) -> None:
    for name in NAMES:
        fn = getattr(fast, name)
        assert fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, f"{name} would release the GIL"
    # llama-cpp-python's own binding of the same symbol releases it: that is why these exist
    assert not llama_cpp.llama_cpp._lib.llama_token_to_piece._flags_ & ctypes._FUNCFLAG_PYTHONAPI


def test_token_pieces_are_the_ones_llama_cpp_python_gives(fast, vocab) -> None:
    v, n = vocab
    assert n > 100
    mine, theirs = ctypes.create_string_buffer(64), ctypes.create_string_buffer(64)
    for token in (0, 1, 2, 50, n // 2, n - 1):
        k = fast.token_to_piece(v, token, mine, 64, 0, True)
        j = llama_cpp.llama_token_to_piece(v, token, theirs, 64, 0, True)
        assert k == j and mine.raw[:k] == theirs.raw[:j]


def test_write_writes_to_a_file_descriptor(fast) -> None:
    r, w = os.pipe()
    try:
        assert fast.write(w, b"token bytes", 11) == 11
        assert os.read(r, 64) == b"token bytes"
    finally:
        os.close(r)
        os.close(w)


def test_a_llama_cpp_without_its_library_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    fake = SimpleNamespace(__file__=str(tmp_path / "__init__.py"), llama_sampler_p_ctypes=ctypes.c_void_p)
    with pytest.raises(RuntimeError, match="cannot locate libllama next to llama_cpp"):
        GilCalls(fake)
