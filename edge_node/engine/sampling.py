"""Per-request sampling parameters and the llama.cpp sampler chain that applies them.

Each request gets its own chain (its own seed and RNG state), so requests decoded in the same batch
sample independently: `llama_sampler_sample(chain, ctx, i)` reads the logits of batch row `i` and
runs top-k/top-p/min-p/temperature/penalties in C, which keeps per-token Python work small.
"""

from __future__ import annotations

import ctypes
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, TypeAlias

from tiergate.core.wire import LOGIT_BIAS_MAX, MAX_TOP_LOGPROBS

if TYPE_CHECKING:  # llama.cpp's opaque handles, as llama-cpp-python types them (it ships py.typed)
    from llama_cpp import llama_context_p, llama_sampler_p, llama_vocab_p

__all__ = ["SamplerChain", "SamplingParams", "check_grammar"]

# llama_sampler_sample(chain, ctx, row) -> token: llama-cpp-python's binding, or GilCalls.sampler_sample
_SampleFn: TypeAlias = "Callable[[llama_sampler_p | None, llama_context_p | None, int], int]"

_DEFAULT_SEED = 0xFFFFFFFF

# What a request that does not say gets: llama.cpp's own defaults (its server and llama-cpp-python's use the
# same), which trim the long tail of a small distilled model's distribution, so a request sent to an edge node
# samples as it would on any llama.cpp server. `top_k: 0` / `min_p: 0` in a request turn them off.
DEFAULT_TOP_K = 40
DEFAULT_MIN_P = 0.05


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """What a request asked for. temperature 0 means greedy (deterministic)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # report each token's log-probability and this many alternatives (0..20)
    grammar: str | None = None  # GBNF the answer must follow (root rule `root`), see edge_node.server.structured

    def validate(self, n_vocab: int) -> str | None:
        """A client-facing message naming the first bad field, or None.

        Every number must be finite and in range: llama.cpp samples in float32, where a huge bias is infinity,
        and a grammar's -inf mask plus +inf is NaN, which makes it sample a forbidden token and abort the
        process. The gateway checks the same; a node reachable without it checks for itself."""
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                return f"{name} must be a finite number"
        if not 0.0 <= self.temperature <= 2.0:
            return "temperature must be between 0 and 2"
        if not 0.0 < self.top_p <= 1.0:
            return "top_p must be in (0, 1]"
        if self.top_k < 0:
            return "top_k must be >= 0"
        if not 0.0 <= self.min_p <= 1.0:
            return "min_p must be between 0 and 1"
        if self.max_tokens is not None and self.max_tokens < 1:
            return "max_tokens must be >= 1"
        if len(self.stop) > 4:
            return "stop accepts at most 4 sequences"
        if not -2.0 <= self.presence_penalty <= 2.0 or not -2.0 <= self.frequency_penalty <= 2.0:
            return "presence_penalty and frequency_penalty must be between -2 and 2"
        if self.repetition_penalty <= 0.0:
            return "repetition_penalty must be > 0"
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            return f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}"
        for t, bias in self.logit_bias.items():
            if not 0 <= t < n_vocab:
                return f"logit_bias token {t} is outside the vocabulary (0..{n_vocab - 1})"
            if not (math.isfinite(bias) and -LOGIT_BIAS_MAX <= bias <= LOGIT_BIAS_MAX):
                return f"logit_bias values must be between -{LOGIT_BIAS_MAX:g} and {LOGIT_BIAS_MAX:g}"
        return None


class SamplerChain:
    """A llama.cpp sampler chain for one request; free() it when the request ends."""

    __slots__ = ("_ll", "_sample", "greedy", "ptr")

    def __init__(self, llama_cpp: ModuleType, params: SamplingParams, n_vocab: int,
                 sample_fn: _SampleFn | None = None, vocab: llama_vocab_p | None = None) -> None:
        ll = llama_cpp
        self._ll = ll
        # `sample_fn`: llama_sampler_sample bound so that it keeps the GIL (edge_node.engine.gilcalls)
        self._sample: _SampleFn = sample_fn or ll.llama_sampler_sample
        cparams = ll.llama_sampler_chain_default_params()
        cparams.no_perf = True
        chain: llama_sampler_p = ll.llama_sampler_chain_init(cparams)
        self.ptr: llama_sampler_p | None = chain
        self.greedy = params.temperature <= 0.0
        add = ll.llama_sampler_chain_add
        if params.grammar is not None:  # first: every later sampler sees only tokens the grammar allows
            grammar = ll.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
            if not grammar:
                ll.llama_sampler_free(chain)
                self.ptr = None
                raise ValueError("the grammar does not parse")
            add(chain, grammar)
        if params.logit_bias:
            arr = (ll.llama_logit_bias * len(params.logit_bias))()
            for i, (tok, bias) in enumerate(params.logit_bias.items()):
                arr[i].token = tok
                arr[i].bias = bias
            add(chain, ll.llama_sampler_init_logit_bias(n_vocab, len(params.logit_bias), arr))
        if params.repetition_penalty != 1.0 or params.presence_penalty or params.frequency_penalty:
            add(
                chain,
                ll.llama_sampler_init_penalties(
                    n_vocab, 256, params.repetition_penalty, params.frequency_penalty, params.presence_penalty
                ),
            )
        if self.greedy:
            add(chain, ll.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(chain, ll.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(chain, ll.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(chain, ll.llama_sampler_init_min_p(params.min_p, 1))
        add(chain, ll.llama_sampler_init_temp(params.temperature))
        seed = params.seed if params.seed is not None else random.getrandbits(32) % _DEFAULT_SEED
        add(chain, ll.llama_sampler_init_dist(ctypes.c_uint32(seed & 0xFFFFFFFF).value))

    def sample(self, ctx: llama_context_p | None, row: int) -> int:
        """Sample (and accept) the next token from batch output row `row`."""
        return self._sample(self.ptr, ctx, row)

    def free(self) -> None:
        if self.ptr:
            self._ll.llama_sampler_free(self.ptr)
            self.ptr = None


def check_grammar(llama_cpp: ModuleType, vocab: llama_vocab_p | None, grammar: str) -> bool:
    """True when llama.cpp parses `grammar` (checked when a request arrives, so a bad one is a 400, not a failure
    on the decode thread)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    if not sampler:
        return False
    llama_cpp.llama_sampler_free(sampler)
    return True
