"""Read the numbers routing needs out of a vLLM server's Prometheus `/metrics` text.

vLLM labels every series by engine and model; a server with several engines (data parallel)
reports one series each, so gauges and counters are summed over label sets (KV-cache usage,
a fraction per engine, is averaged). Counters are cumulative since the server started: rates are
computed by `Window` from two readings, which also notices a restart (counters going down).
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import dataclass

__all__ = ["NotVllmError", "Rates", "VllmMetrics", "Window", "parse"]

_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # the second: vLLM < 0.10
_COUNTERS = {
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
    "vllm:spec_decode_num_drafts": "spec_drafts",
    "vllm:spec_decode_num_draft_tokens": "spec_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "spec_accepted_tokens",
}


class NotVllmError(ValueError):
    """The text parsed but is not a vLLM server's metrics (another service on that address)."""


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """One reading of a server's load gauges and cumulative counters."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0  # fraction in [0, 1]
    prefix_cache_queries: float = 0.0  # tokens looked up in the prefix cache
    prefix_cache_hits: float = 0.0  # of those, tokens found
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    spec_drafts: float = 0.0
    spec_draft_tokens: float = 0.0
    spec_accepted_tokens: float = 0.0
    spec_decode: bool = False  # the server exposes speculative-decoding counters
    block_size: int | None = None  # from vllm:cache_config_info, when present
    kv_blocks: int | None = None  # the KV cache's size in blocks (num_gpu_blocks of vllm:cache_config_info)
    max_model_len: int | None = None  # the served model's context, from /v1/models (read with the model check)

    def restarted_after(self, before: VllmMetrics) -> bool:
        """The counters went down since `before`: the server restarted (and its prefix cache is empty)."""
        return self.prefix_cache_queries < before.prefix_cache_queries

    @property
    def kv_tokens(self) -> int | None:
        """The KV cache's size in tokens, when the server says (cache_config_info)."""
        return self.kv_blocks * self.block_size if self.kv_blocks and self.block_size else None


_SAMPLES = {_RUNNING: _RUNNING, _WAITING: _WAITING, **{k: "kv" for k in _KV_USAGE},
            **{name + "_total": key for name, key in _COUNTERS.items()}}
_BLOCK_SIZE = re.compile(r'[{,]block_size="(\d+)"')
_KV_BLOCKS = re.compile(r'[{,]num_gpu_blocks="(\d+)"')


def _sample(line: str) -> tuple[str, str, float] | None:
    """`name{labels} value [timestamp]` → (name, labels, value) for the samples parse() reads, else None."""
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name, close = line[:brace], line.rfind("}")
        if close < brace:
            raise ValueError(f"unterminated labels in {line[:80]!r}")
        labels, rest = line[brace:close + 1], line[close + 1:]
    elif space != -1:
        name, labels, rest = line[:space], "", line[space:]
    else:
        name, labels, rest = line, "", ""
    if name not in _SAMPLES and name != "vllm:cache_config_info":
        return None
    value = rest.split()
    if not value:
        raise ValueError(f"no value in {line[:80]!r}")
    return name, labels, float(value[0])


def parse(text: str) -> VllmMetrics:
    """Parse Prometheus exposition text; raises NotVllmError when the vLLM gauges are absent.

    Only the handful of vLLM samples routing needs are read; every other line (comments, histograms' buckets,
    Python's own metrics: most of a 50 KB page) is skipped on its first characters. A general Prometheus parser
    took ~15-40 ms per page on the gateway's event loop, for every server, every poll.
    """
    sums: dict[str, float] = {}
    kv: list[float] = []
    seen_running = False
    spec = False
    block_size: int | None = None
    kv_blocks: int | None = None
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        sample = _sample(line)
        if sample is None:
            continue
        name, labels, value = sample
        key = _SAMPLES.get(name)
        if name == "vllm:cache_config_info":
            if m := _BLOCK_SIZE.search(labels):
                block_size = int(m.group(1))
            if m := _KV_BLOCKS.search(labels):
                kv_blocks = int(m.group(1))
        elif key == "kv":
            kv.append(value)
        elif key is not None:  # None: only the cache_config_info line, read above
            seen_running |= key == _RUNNING
            spec |= name.startswith("vllm:spec_decode_")
            sums[key] = sums.get(key, 0.0) + value
    if not seen_running:
        raise NotVllmError(f"not a vLLM server: /metrics has no {_RUNNING}")
    finite = [v for v in kv if math.isfinite(v)]
    return VllmMetrics(
        running=sums.get(_RUNNING, 0.0),
        waiting=sums.get(_WAITING, 0.0),
        kv_cache_usage=sum(finite) / len(finite) if finite else 0.0,
        prefix_cache_queries=sums.get("prefix_cache_queries", 0.0),
        prefix_cache_hits=sums.get("prefix_cache_hits", 0.0),
        prompt_tokens=sums.get("prompt_tokens", 0.0),
        generation_tokens=sums.get("generation_tokens", 0.0),
        spec_drafts=sums.get("spec_drafts", 0.0),
        spec_draft_tokens=sums.get("spec_draft_tokens", 0.0),
        spec_accepted_tokens=sums.get("spec_accepted_tokens", 0.0),
        spec_decode=spec,
        block_size=block_size,
        kv_blocks=kv_blocks,
    )


@dataclass(frozen=True, slots=True)
class Rates:
    """Ratios over the recent window; None when nothing happened in it."""

    prefix_cache_hit_rate: float | None = None  # hit tokens / queried tokens
    spec_acceptance_rate: float | None = None  # accepted draft tokens / proposed draft tokens
    spec_mean_accepted_length: float | None = None  # 1 + accepted tokens per draft: tokens per step
    generation_tokens_per_s: float | None = None


class Window:
    """Rates from cumulative counters over the last `span_s` seconds of readings."""

    def __init__(self, span_s: float = 60.0) -> None:
        self.span_s = span_s
        self._readings: deque[tuple[float, VllmMetrics]] = deque()

    def add(self, reading: VllmMetrics, now: float | None = None) -> Rates:
        now = time.monotonic() if now is None else now
        if self._readings and reading.restarted_after(self._readings[-1][1]):
            self._readings.clear()
        self._readings.append((now, reading))
        while len(self._readings) > 2 and now - self._readings[1][0] >= self.span_s:
            self._readings.popleft()
        return self.rates()

    def rates(self) -> Rates:
        if len(self._readings) < 2:
            return Rates()
        (t0, a), (t1, b) = self._readings[0], self._readings[-1]
        queries = b.prefix_cache_queries - a.prefix_cache_queries
        drafted = b.spec_draft_tokens - a.spec_draft_tokens
        drafts = b.spec_drafts - a.spec_drafts
        accepted = b.spec_accepted_tokens - a.spec_accepted_tokens
        generated = b.generation_tokens - a.generation_tokens
        return Rates(
            prefix_cache_hit_rate=(b.prefix_cache_hits - a.prefix_cache_hits) / queries if queries > 0 else None,
            spec_acceptance_rate=accepted / drafted if drafted > 0 else None,
            spec_mean_accepted_length=1.0 + accepted / drafts if drafts > 0 else None,
            generation_tokens_per_s=generated / (t1 - t0) if t1 > t0 else None,
        )
