"""One decode step of the continuous batch: build one `llama_batch` for every busy slot, decode, sample.

The batch holds the next token of every generating slot plus prompt chunks of slots still prefilling (oldest
request first, within `n_batch`), tagged by sequence; one `llama_decode` serves them all; then each slot that
asked for logits samples its next token from its own row with its own sampler chain. Runs on the decode thread.
"""

from __future__ import annotations

import asyncio
import ctypes
import time
from types import ModuleType
from typing import TypeAlias

import numpy as np
import structlog

from tiergate.edge_node.engine.request import ActiveRequest, Chunk, FinishReason
from tiergate.edge_node.engine.runtime import LlamaRuntime
from tiergate.edge_node.engine.slots import SlotTable
from tiergate.edge_node.server.logprobs import LogprobReader
from tiergate.edge_node.server.metrics import EdgeMetrics

__all__ = ["Batch", "DecodeStep", "Outbox"]

log = structlog.get_logger("edge_node.engine")

# event loop → [(request, chunk)]: what one step hands to asyncio, one wake-up per loop
Outbox: TypeAlias = dict[asyncio.AbstractEventLoop, list[tuple[ActiveRequest, Chunk]]]


class Batch:
    """A llama_batch over numpy buffers we own, so filling it is vectorised (one seq id per token)."""

    def __init__(self, ll: ModuleType, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)(
            *(ctypes.cast(self.seq.ctypes.data + 4 * i, i32p) for i in range(capacity))
        )
        b = ll.llama_batch()
        b.n_tokens = 0
        b.token = self.token.ctypes.data_as(i32p)
        b.embd = None
        b.pos = self.pos.ctypes.data_as(i32p)
        b.n_seq_id = self.n_seq_id.ctypes.data_as(i32p)
        b.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.struct = b


class DecodeStep:
    """Builds, decodes and samples one batch; emits text chunks and finished requests into an outbox."""

    def __init__(self, runtime: LlamaRuntime, slots: SlotTable, metrics: EdgeMetrics) -> None:
        self.rt = runtime
        self.slots = slots
        self.metrics = metrics
        self.n_batch = runtime.cfg.n_batch
        self.batch = Batch(runtime.llama, self.n_batch)
        self.logprobs = LogprobReader(runtime.llama, runtime.ctx, runtime.n_vocab, runtime.piece)

    def run(self, out: Outbox) -> int:
        """One step; returns how many tokens it generated (for tokens/s)."""
        b = self.batch
        toks: list[int] = []
        poss: list[int] = []
        seqs: list[int] = []
        outs: list[int] = []
        # (request, first index in batch, n tokens, output row or -1)
        parts: list[tuple[ActiveRequest, int, int, int]] = []
        for s in self.slots.slots:
            req = s.request
            if req is not None and not req.prefilling:
                i = len(toks)
                toks.append(req.next_token)
                poss.append(len(s.tokens))
                seqs.append(s.seq)
                outs.append(1)
                parts.append((req, i, 1, i))
        budget = self.n_batch - len(toks)
        if budget > 0:
            prefilling = [r for r in self.slots.active() if r.prefilling]
            prefilling.sort(key=lambda r: r.submitted)
            for req in prefilling:
                if budget <= 0:
                    break
                slot = req.slot
                assert slot is not None  # a request in `active()` is in a slot
                start = req.n_prompt_done
                k = min(len(req.prompt) - start, budget)
                i = len(toks)
                toks.extend(req.prompt[start:start + k])
                base = len(slot.tokens)
                poss.extend(range(base, base + k))
                seqs.extend([slot.seq] * k)
                done = start + k == len(req.prompt)
                outs.extend([0] * (k - 1))
                outs.append(1 if done else 0)
                parts.append((req, i, k, i + k - 1 if done else -1))
                budget -= k
        n = len(toks)
        if n == 0:
            return 0
        b.token[:n] = toks
        b.pos[:n] = poss
        b.seq[:n] = seqs
        b.logits[:n] = outs
        b.struct.n_tokens = n
        t0 = time.perf_counter()
        rc = self.rt.llama.llama_decode(self.rt.ctx, b.struct)
        dt = time.perf_counter() - t0
        m = self.metrics
        m.decode_calls.inc()
        m.decode_seconds.observe(dt)
        m.batch_tokens.observe(n)
        m.batch_sequences.observe(len(parts))
        if len(parts) > 1:
            m.multi_sequence_decodes.inc()
        if rc != 0:
            self._decode_failed(rc, parts, out)
            return 0
        now = time.monotonic()
        generated = 0
        for req, i, k, row in parts:
            slot = req.slot
            assert slot is not None  # every request in the batch is in a slot
            if req.prefilling:
                slot.tokens.extend(toks[i:i + k])
                req.n_prompt_done += k
            else:
                slot.tokens.append(req.next_token)
            if row >= 0:
                generated += self._sample(req, row, now, out)
        if generated:
            m.generation_tokens.inc(generated)
        return generated

    def _sample(self, req: ActiveRequest, row: int, now: float, out: Outbox) -> int:
        """Sample one token for `req`, emit its text, finish the request if it is done. Returns 1 if counted."""
        rt = self.rt
        assert req.sampler is not None  # admission gives a request its sampler before it gets a slot
        tok = req.sampler.sample(rt.ctx, row)
        if req.first_token_at is None:
            req.first_token_at = now
            self.metrics.time_to_first_token.observe(now - req.submitted)
        if rt.is_eog(tok):
            self._finish(req, "stop", req.text.flush(), out)
            return 0
        req.n_generated += 1
        if req.logprobs is not None:
            req.logprobs.append(self.logprobs.read(row, tok, req.params.logprobs or 0))
        text = req.text.feed(rt.piece(tok))
        if req.text.stopped:
            self._finish(req, "stop", text, out)
        elif req.n_generated >= req.max_new:
            self._finish(req, "length", text + req.text.flush(), out)
        else:
            req.next_token = tok
            if text:
                out.setdefault(req.loop, []).append((req, Chunk(text, logprobs=req.take_logprobs())))
        return 1

    def _finish(self, req: ActiveRequest, reason: FinishReason, text: str, out: Outbox) -> None:
        chunk = Chunk(text, reason, len(req.prompt), req.n_generated, req.cached, logprobs=req.take_logprobs())
        out.setdefault(req.loop, []).append((req, chunk))
        self.metrics.requests.labels(req.endpoint, reason).inc()
        self.slots.release(req)

    def _decode_failed(self, rc: int, parts: list[tuple[ActiveRequest, int, int, int]], out: Outbox) -> None:
        """llama_decode refused the batch: fail those requests, reset their sequences."""
        why = {1: "no KV cache space for the batch", 2: "decode aborted", -1: "invalid batch"}.get(
            rc, f"llama_decode failed ({rc})"
        )
        log.error("decode failed", rc=rc, reason=why, llama=self.rt.last_llama_error())
        for req, _i, _k, _row in parts:
            slot = req.slot
            if slot is None:
                continue
            self.slots.reset(slot)
            out.setdefault(req.loop, []).append((req, Chunk("", error=why)))
            self.metrics.request_errors.labels("decode_failed").inc()
            self.slots.release(req)
