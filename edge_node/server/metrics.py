"""Prometheus metrics of one edge node (prefix `tiergate_edge_`), in their own registry.

`tiergate_edge_batch_sequences` (sequences per llama_decode) is the proof of continuous batching:
with overlapping requests its observations land above the le="1" bucket.
Gauges that mirror engine state are read at scrape time (no per-token cost).
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["EdgeMetrics"]

_P = "tiergate_edge_"


class EdgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.prompt_tokens = Counter(_P + "prompt_tokens", "Prompt tokens received (after templating).", registry=r)
        self.prompt_tokens_cached = Counter(
            _P + "prompt_tokens_cached", "Prompt tokens whose KV was reused from a shared prefix.", registry=r
        )
        self.generation_tokens = Counter(_P + "generation_tokens", "Tokens generated.", registry=r)
        self.requests = Counter(
            _P + "requests", "Finished requests by endpoint and finish reason.", ["endpoint", "finish_reason"],
            registry=r,
        )
        self.request_errors = Counter(
            _P + "request_errors", "Requests refused or failed, by error code.", ["code"], registry=r
        )
        self.cancelled = Counter(_P + "requests_cancelled", "Requests whose client went away.", registry=r)
        self.decode_calls = Counter(_P + "decode_calls", "llama_decode calls.", registry=r)
        self.multi_sequence_decodes = Counter(
            _P + "multi_sequence_decodes", "llama_decode calls carrying tokens of two or more sequences.", registry=r
        )
        self.batch_sequences = Histogram(
            _P + "batch_sequences", "Sequences per llama_decode call.",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64), registry=r,
        )
        self.batch_tokens = Histogram(
            _P + "batch_tokens", "Tokens per llama_decode call.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048), registry=r,
        )
        self.decode_seconds = Histogram(
            _P + "decode_seconds", "Wall time of one llama_decode call.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r,
        )
        self.time_to_first_token = Histogram(
            _P + "time_to_first_token_seconds", "From submission to the first generated token.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r,
        )
        self.tokens_per_second = Gauge(
            _P + "tokens_per_second", "Generated tokens per second over the last few seconds.", registry=r
        )
        self.slots = Gauge(_P + "slots", "Sequences the engine decodes at once (--parallel).", registry=r)
        self.busy_slots = Gauge(_P + "busy_slots", "Slots serving a request now.", registry=r)
        self.queued_requests = Gauge(_P + "queued_requests", "Requests waiting for a free slot.", registry=r)
        self.kv_cells_used = Gauge(_P + "kv_cells_used", "KV cache cells holding tokens (incl. reusable prefixes).",
                                   registry=r)
        self.kv_cells_total = Gauge(_P + "kv_cells_total", "KV cache capacity in cells (tokens).", registry=r)
        self.kv_usage_ratio = Gauge(_P + "kv_usage_ratio", "kv_cells_used / kv_cells_total.", registry=r)

    def bind_engine(
        self,
        slots: Callable[[], float],
        busy: Callable[[], float],
        queued: Callable[[], float],
        kv_used: Callable[[], float],
        kv_total: Callable[[], float],
        tokens_per_second: Callable[[], float],
    ) -> None:
        """Read engine state at scrape time."""
        self.slots.set_function(slots)
        self.busy_slots.set_function(busy)
        self.queued_requests.set_function(queued)
        self.kv_cells_used.set_function(kv_used)
        self.kv_cells_total.set_function(kv_total)
        self.kv_usage_ratio.set_function(lambda: kv_used() / max(kv_total(), 1.0))
        self.tokens_per_second.set_function(tokens_per_second)

    def render(self) -> bytes:
        return generate_latest(self.registry)
