"""Token log-probabilities, read from the logits llama.cpp computed for a batch row.

A value is the log-softmax of the model's raw logits at that position, computed as llama-cpp-python does
(`Llama.logits_to_logprobs`, float32), so an edge node reports what llama.cpp itself reports for the same model
and prompt, whatever sampling settings the request used. Only requests that ask for logprobs pay for it (one
pass over the vocabulary per generated token: tens of microseconds for a 49k vocabulary).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # llama.cpp's context handle, as llama-cpp-python types it (it ships py.typed)
    from llama_cpp import llama_context_p

__all__ = ["LogprobReader", "TokenLogprob"]


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token: its log-probability and the `top` most likely tokens at its position, best first."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[tuple[int, bytes, float], ...]


class LogprobReader:
    def __init__(self, llama_cpp: ModuleType, ctx: llama_context_p | None, n_vocab: int,
                 piece: Callable[[int], bytes]) -> None:
        self._get = llama_cpp.llama_get_logits_ith
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._piece = piece  # token id → bytes

    def read(self, row: int, token: int, top: int) -> TokenLogprob:
        ptr = self._get(self._ctx, row)
        logits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(self._n_vocab,))
        peak = logits.max()
        shifted = np.subtract(logits, peak if np.isfinite(peak) else 0.0, dtype=np.single)
        logprobs = shifted - np.log(np.exp(shifted).sum())
        best: tuple[tuple[int, bytes, float], ...] = ()
        if top > 0:
            idx = np.argpartition(logprobs, -top)[-top:]
            idx = idx[np.argsort(-logprobs[idx], kind="stable")]
            best = tuple((int(i), self._piece(int(i)), float(logprobs[i])) for i in idx)
        return TokenLogprob(token, self._piece(token), float(logprobs[token]), best)
