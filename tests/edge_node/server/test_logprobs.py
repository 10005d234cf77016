"""Log-probabilities read from a row of logits: the same numbers llama-cpp-python reports for those logits, the
chosen token's own value, and the `top` alternatives best first.

The reader takes the llama_cpp bindings as an argument; here a row of logits we wrote stands in for llama.cpp's
buffer (the engine tests run it on the real model)."""

from __future__ import annotations

import ctypes
import math
from types import SimpleNamespace

import numpy as np
import pytest

from tiergate.edge_node.server.logprobs import LogprobReader, TokenLogprob

llama_cpp = pytest.importorskip("llama_cpp")  # the reference: llama-cpp-python's own log-softmax


def reader(rows: list[np.ndarray]) -> tuple[LogprobReader, list[tuple[object, int]]]:
    """A reader over `rows` (float32 logits, one per batch row), and the (ctx, row) pairs it asked for."""
    buffers = [np.ascontiguousarray(r, dtype=np.float32) for r in rows]
    asked: list[tuple[object, int]] = []

    def get_logits_ith(ctx: object, row: int) -> int:
        asked.append((ctx, row))
        return buffers[row].ctypes.data_as(ctypes.POINTER(ctypes.c_float))

    bindings = SimpleNamespace(llama_get_logits_ith=get_logits_ith)
    return LogprobReader(bindings, "ctx", len(buffers[0]), lambda t: f"<{t}>".encode()), asked


def test_values_are_what_llama_cpp_python_computes_for_the_same_logits() -> None:
    logits = np.random.default_rng(0).normal(0, 4, 5000).astype(np.float32)
    r, asked = reader([np.zeros(5000), logits])
    got = r.read(1, token=17, top=5)
    want = llama_cpp.Llama.logits_to_logprobs(logits)
    assert asked == [("ctx", 1)]
    assert got.token == 17 and got.piece == b"<17>"
    assert got.logprob == float(want[17])
    best = np.argsort(-want, kind="stable")[:5]
    assert got.top == tuple((int(i), f"<{i}>".encode(), float(want[i])) for i in best)
    assert math.isclose(sum(math.exp(v) for v in want.astype(np.float64)), 1.0, rel_tol=1e-4)


def test_the_top_alternatives_are_best_first_and_ties_keep_token_order() -> None:
    logits = np.array([1.0, 3.0, 3.0, 0.5, 3.0, -2.0], np.float32)
    r, _ = reader([logits])
    got = r.read(0, token=5, top=4)
    assert [t for t, _, _ in got.top] == [1, 2, 4, 0]
    assert got.top[0][2] == got.top[1][2] == got.top[2][2] > got.top[3][2] > got.logprob
    assert r.read(0, token=5, top=0).top == ()


def test_huge_logits_do_not_overflow() -> None:
    logits = np.array([1e30, 1e30, -1e30, 0.0], np.float32)  # exp(1e30) alone would overflow
    got = reader([logits])[0].read(0, token=0, top=2)
    assert math.isfinite(got.logprob) and got.logprob == pytest.approx(math.log(0.5), abs=1e-6)


def test_a_masked_token_has_minus_infinity_and_is_not_preferred() -> None:
    logits = np.array([-np.inf, 2.0, -np.inf, 1.0], np.float32)  # a grammar or logit bias forbade 0 and 2
    got = reader([logits])[0].read(0, token=1, top=3)
    assert got.logprob == pytest.approx(float(llama_cpp.Llama.logits_to_logprobs(logits)[1]))
    assert [t for t, _, _ in got.top[:2]] == [1, 3] and got.top[2][2] == -math.inf


def test_a_token_logprob_is_a_frozen_value() -> None:
    t = TokenLogprob(1, b"a", -0.1, ())
    with pytest.raises(AttributeError):
        t.logprob = 0.0  # type: ignore[misc]
    assert t == TokenLogprob(1, b"a", -0.1, ())
