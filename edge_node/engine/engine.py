"""Continuous batching on llama.cpp's low-level API.

One dedicated thread owns the llama_context and loops:
  admit waiting requests into free slots (reusing KV of a shared prompt prefix) →
  build one batch: the next token of every generating slot + prompt chunks of slots still prefilling →
  one `llama_decode` for all of them (several seq_ids per batch) →
  sample each slot's next token from its own batch row with its own sampler chain →
  hand text deltas to asyncio consumers (one wake-up per step, see `edge_node.engine.handoff`).
Requests join and leave between steps; a cancelled request frees its slot at the next step.

Each slot is one llama.cpp sequence (seq_id = slot index). A slot keeps the KV of its last request
after it finishes, so a later request sharing a prefix (same system prompt, a chat turn that extends
the previous one) skips that part of the prefill; a prefix held by another slot is copied with
`llama_memory_seq_cp` when that saves enough work.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from tiergate.edge_node.engine.batch import DecodeStep, Outbox
from tiergate.edge_node.engine.handoff import Handoffs
from tiergate.edge_node.engine.lora_swap import LoraSwap
from tiergate.edge_node.engine.request import ActiveRequest, Chunk
from tiergate.edge_node.engine.runtime import LlamaRuntime
from tiergate.edge_node.engine.sampling import SamplerChain, SamplingParams
from tiergate.edge_node.engine.slots import PREFIX_COPY_MIN, PREFIX_REUSE_MIN, SlotTable
from tiergate.edge_node.engine.throughput import TokenRate
from tiergate.edge_node.server.metrics import EdgeMetrics

__all__ = [
    "Chunk",
    "ContextOverflowError",
    "Engine",
    "EngineClosedError",
    "EngineError",
    "EngineFailedError",
    "EngineStats",
    "Generation",
    "QueueFullError",
]

log = structlog.get_logger("edge_node.engine")


SHUTTING_DOWN = "the edge node is shutting down"
"""Why a stopped engine ends the requests it still held (`EngineClosedError`): retryable elsewhere."""


class EngineError(RuntimeError):
    """Generation failed inside llama.cpp (the request cannot be completed)."""


class EngineClosedError(EngineError):
    """The engine is stopping or stopped and takes no new requests."""


class EngineFailedError(EngineError):
    """The decode loop died (see `Engine.failure`); the node needs a restart."""


class QueueFullError(EngineError):
    """Every slot is busy and the waiting queue is at its bound: shed now rather than queue for ever."""


class ContextOverflowError(ValueError):
    """Prompt (plus requested completion) does not fit in one slot's context."""

    def __init__(self, limit: int, prompt_tokens: int, max_tokens: int | None) -> None:
        self.limit, self.prompt_tokens, self.max_tokens = limit, prompt_tokens, max_tokens
        if max_tokens is None or prompt_tokens >= limit:
            msg = (
                f"This model's maximum context length is {limit} tokens. However, your prompt has "
                f"{prompt_tokens} tokens, which leaves no room for a completion. Shorten the prompt."
            )
        else:
            msg = (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, {max_tokens} for the "
                "completion). Reduce the prompt or max_tokens."
            )
        super().__init__(msg)


@dataclass(frozen=True, slots=True)
class EngineStats:
    slots: int
    busy: int
    queued: int
    ctx_per_slot: int
    kv_cells_used: int
    kv_cells_total: int
    tokens_per_s: float = 0.0  # generated over the last few seconds (its cost per token, to the gateway)


class Generation:
    """Handle on one submitted request: async-iterate its chunks; `cancel()` frees its slot."""

    def __init__(self, engine: Engine, req: ActiveRequest) -> None:
        self._engine = engine
        self._req = req
        self.id = req.id
        self.prompt_tokens = len(req.prompt)
        self.finished = False

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Chunk:
        if self.finished:
            raise StopAsyncIteration
        chunk = await self._req.queue.get()
        if chunk.error is not None:
            self.finished = True
            raise (EngineClosedError if chunk.error == SHUTTING_DOWN else EngineError)(chunk.error)
        if chunk.finish_reason is not None:
            self.finished = True
        return chunk

    @property
    def completion_tokens(self) -> int:
        """Tokens generated so far (final once the request has ended, however it ended)."""
        return self._req.n_generated

    def cancel(self) -> None:
        """The consumer went away: stop generating and free the slot (idempotent)."""
        if not self.finished:
            self.finished = True
            self._engine._cancel(self._req)


class Engine:
    """The decode loop and its request queue. Thread-safe submit/cancel; one engine per llama_context."""

    def __init__(
        self,
        runtime: LlamaRuntime,
        metrics: EdgeMetrics | None = None,
        *,
        prefix_reuse_min: int = PREFIX_REUSE_MIN,
        prefix_copy_min: int = PREFIX_COPY_MIN,
        tps_window_s: float = 5.0,
        max_queue: int | None = None,
    ) -> None:
        self.rt = runtime
        self.metrics = metrics or EdgeMetrics()
        self.parallel = runtime.n_seq_max
        self.ctx_per_slot = runtime.cfg.ctx_per_seq
        self.max_queue = max_queue  # None: unbounded (embedding and tests); the CLI bounds it
        self._slots = SlotTable(runtime, prefix_reuse_min=prefix_reuse_min, prefix_copy_min=prefix_copy_min)
        self._step = DecodeStep(runtime, self._slots, self.metrics)
        self._cv = threading.Condition()
        self._waiting: deque[ActiveRequest] = deque()
        self._cancels: list[ActiveRequest] = []
        self._running = False
        self._accepting = True
        self.failure: str | None = None  # why the decode loop died, if it did
        self.on_failure: Callable[[str], None] | None = None  # called from the engine thread once it has died
        self._admitting: ActiveRequest | None = None
        self._swap: LoraSwap | None = None  # an adapter change waiting for the slots to empty
        self._held = False  # test hook: the loop parks before its next step (`hold`)
        self._parked = False
        self._thread: threading.Thread | None = None
        self._ids = itertools.count(1)
        self.throughput = TokenRate(tps_window_s)
        self._handoffs = Handoffs(runtime.fast.write)
        self.metrics.bind_engine(
            slots=lambda: float(self.parallel),
            busy=lambda: float(self._slots.busy),
            queued=lambda: float(len(self._waiting)),
            kv_used=lambda: float(self._slots.kv_used()),
            kv_total=lambda: float(self.ctx_per_slot * self.parallel),
            tokens_per_second=self.throughput.per_second,
        )

    # ------------------------------------------------------------------ public surface

    def start(self) -> None:
        """Start the decode thread (once: a stopped engine is not restarted)."""
        if self._thread is not None:
            return
        self._running = True
        self._thread = threading.Thread(target=self._run, name="edge-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running end with an error chunk."""
        with self._cv:
            self._accepting = False
            self._running = False
            self._cv.notify_all()
        if self._thread is not None:  # kept after a join timeout: close() must see the thread still running
            self._thread.join(timeout)
        self._handoffs.close_all()

    def close(self) -> None:
        """Stop, then free the model, but only once the decode thread has really exited.

        A thread still inside `llama_decode` after the join timeout would use freed memory; leaving the
        model to the process exit is the safe choice then.
        """
        self.stop()
        if self._thread is not None and self._thread.is_alive():
            log.warning("engine thread still running after stop; leaving the model loaded until exit")
            return
        self.rt.close()

    @property
    def alive(self) -> bool:
        """The decode loop is running and has not failed (what /health reports)."""
        return self.failure is None and self._thread is not None and self._thread.is_alive()

    def stop_accepting(self) -> None:
        """Drain mode: refuse new requests, keep decoding the ones in flight."""
        with self._cv:
            self._accepting = False

    def hold(self, timeout: float = 30.0) -> bool:
        """Test hook: park the decode loop before its next step, every request staying where it is, until
        `release()` or `stop()`. Lets a test reach a known state (say, requests in flight at a drain deadline)
        instead of sampling a race. True once the loop is parked (or stopped)."""
        with self._cv:
            self._held = True
            self._cv.notify_all()
            return self._cv.wait_for(lambda: self._parked or not self._running, timeout)

    def release(self) -> None:
        """Undo `hold()`."""
        with self._cv:
            self._held = False
            self._cv.notify_all()

    def swap_lora(self, path: Path | None) -> None:
        """Serve with the GGUF LoRA adapter at `path` (None: none) from now on, dropping no request: admission
        pauses, the requests in the slots finish, the adapter changes (`LoraSwap`), admission resumes. Blocks;
        raises `ModelLoadError` (the current adapter stays) or `EngineError`."""
        swap = LoraSwap(path)
        with self._cv:
            if not self._running or self._swap is not None:
                raise EngineError("the engine is not running" if not self._running else "a swap is already under way")
            self._swap = swap
            self._cv.notify_all()
        if not swap.wait(lambda: self.alive):
            raise EngineClosedError("the engine stopped before the adapter was swapped")

    def stats(self) -> EngineStats:
        return EngineStats(
            slots=self.parallel,
            busy=self._slots.busy,
            queued=len(self._waiting),
            ctx_per_slot=self.ctx_per_slot,
            kv_cells_used=self._slots.kv_used(),
            kv_cells_total=self.ctx_per_slot * self.parallel,
            tokens_per_s=self.throughput.per_second(),
        )

    def in_flight(self) -> int:
        return self._slots.busy + len(self._waiting)

    def tokens_per_second(self) -> float:
        return self.throughput.per_second()

    def tokenize_prompt(self, text: str) -> list[int]:
        """Plain completion prompt → tokens (BOS added when the model wants one)."""
        return self.rt.tokenize(text, add_bos=self.rt.add_bos, parse_special=True)

    def tokenize_chat(self, messages: Sequence[dict[str, Any]],
                      tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Chat messages → prompt tokens through the model's chat template (raises ChatTemplateError)."""
        text = self.rt.chat_template.render(messages, add_generation_prompt=True, tools=tools)
        toks = self.rt.tokenize(text, add_bos=False, parse_special=True)
        if self.rt.add_bos and self.rt.bos >= 0 and (not toks or toks[0] != self.rt.bos):
            toks.insert(0, self.rt.bos)
        return toks

    def check_fits(self, n_prompt: int, max_tokens: int | None) -> None:
        if n_prompt >= self.ctx_per_slot or (max_tokens is not None and n_prompt + max_tokens > self.ctx_per_slot):
            raise ContextOverflowError(self.ctx_per_slot, n_prompt, max_tokens)

    def submit(self, prompt: list[int], params: SamplingParams, endpoint: str = "completions") -> Generation:
        """Queue a request (call from the event loop that will consume it). Raises ContextOverflowError."""
        if not prompt:
            raise ValueError("prompt is empty")
        self.check_fits(len(prompt), params.max_tokens)
        room = self.ctx_per_slot - len(prompt)
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        loop = asyncio.get_running_loop()
        self._handoffs.register(loop)
        req = ActiveRequest(f"{next(self._ids)}", list(prompt), params, max_new, endpoint, loop)
        with self._cv:
            if self.failure is not None:
                raise EngineFailedError(f"the edge node's engine has failed ({self.failure}); restart it")
            if not self._accepting or not self._running:
                raise EngineClosedError(SHUTTING_DOWN)
            # Requests in `_waiting` may still be headed for a free slot, so the bound is on what cannot get
            # one: everything held (queued, being admitted, in a slot) beyond the number of slots.
            waiting = len(self._waiting) + (self._admitting is not None) + self._slots.busy - self.parallel
            if self.max_queue is not None and waiting >= self.max_queue:
                raise QueueFullError(f"the edge node has {waiting} requests waiting for a slot "
                                     f"(--max-queue {self.max_queue}); retry shortly or use another node")
            self._waiting.append(req)
            self._cv.notify_all()  # the loop, and a `hold()` waiting for it to park
        return Generation(self, req)

    def _cancel(self, req: ActiveRequest) -> None:
        with self._cv:
            req.cancelled = True
            self._cancels.append(req)
            self._cv.notify_all()

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        out: Outbox = {}
        try:
            while True:
                with self._cv:
                    while self._running and (self._held or self._idle()):
                        if self._held and not self._parked:
                            self._parked = True
                            self._cv.notify_all()
                        self._cv.wait()
                    self._parked = False
                    if not self._running:
                        break
                    cancels, self._cancels = self._cancels, []
                out = {}
                for req in cancels:
                    self._drop(req)
                if (swap := self._swap) is not None and self._slots.busy == 0:
                    with self._cv:  # cleared first: the caller may ask for the next swap as soon as this one is done
                        self._swap = None
                    swap.apply(self.rt, self._slots)
                if self._swap is None:
                    self._admit()
                if self._slots.busy and (generated := self._step.run(out)):
                    self.throughput.add(generated)
                self._handoffs.deliver(out)
        except Exception as e:  # noqa: BLE001 - a bug or a llama.cpp failure: _crashed logs it, fails everyone
            self._crashed(f"engine failure: {type(e).__name__}: {e}", out)
            return
        self._fail_all(SHUTTING_DOWN)

    def _idle(self) -> bool:
        return not self._cancels and not self._waiting and self._slots.busy == 0 and self._swap is None

    def _crashed(self, why: str, out: Outbox) -> None:
        """The decode loop died: take no more requests, and end every request it held with an error.

        That includes the chunks of the step that failed (they were never delivered) and a request that was
        between the queue and a slot. /health turns 503 (`failure`), so the gateway stops sending traffic.
        """
        log.exception("engine loop crashed", reason=why)
        with self._cv:
            self._running = False
            self._accepting = False
            self.failure = why
        self.metrics.request_errors.labels("engine_crashed").inc()
        req = self._admitting  # half-assigned perhaps (slot chosen, sampler not built): in no slot's hands yet
        if req is not None and not req.cancelled and req.slot is None:
            out.setdefault(req.loop, []).append((req, Chunk("", error=why)))
        try:
            self._handoffs.deliver(out)
            self._fail_all(why)
        except Exception:  # the clean-up itself failed: still tell every waiting client
            log.exception("engine clean-up after the crash failed")
            for r in [*self._waiting, *self._slots.active()]:
                if not r.cancelled:
                    with contextlib.suppress(Exception):
                        r.loop.call_soon_threadsafe(r.queue.put_nowait, Chunk("", error=why))
        if self.on_failure is not None:
            self.on_failure(why)

    def _drop(self, req: ActiveRequest) -> None:
        """Forget a cancelled request wherever it is; its slot becomes free now."""
        if req.slot is None:
            with self._cv:
                try:
                    self._waiting.remove(req)
                except ValueError:
                    return
            self.metrics.cancelled.inc()
            return
        self.metrics.cancelled.inc()
        self._slots.release(req)

    # ------------------------------------------------------------------ admission and prefix reuse

    def _admit(self) -> None:
        while True:
            with self._cv:
                if not self._waiting:
                    return
                free = self._slots.free()
                if not free:
                    return
                req = self._waiting.popleft()
                if req.cancelled:
                    continue
                self._admitting = req  # neither queued nor in a slot: still counted, and failed on a crash
            try:
                req.sampler = SamplerChain(self.rt.llama, req.params, self.rt.n_vocab,
                                           sample_fn=self.rt.fast.sampler_sample, vocab=self.rt.vocab)
            except ValueError as exc:  # its grammar (checked on arrival, so this is a bug): fail it alone
                with self._cv:
                    self._admitting = None
                self._handoffs.deliver({req.loop: [(req, Chunk("", error=f"sampler: {exc}"))]})
                continue
            slot = self._slots.prepare(req, free)
            with self._cv:  # from "admitting" to "in a slot" in one step, as submit's queue bound counts them
                self._slots.occupy(slot, req)
                self._admitting = None
            self.metrics.prompt_tokens.inc(len(req.prompt))
            if req.cached:
                self.metrics.prompt_tokens_cached.inc(req.cached)

    def _fail_all(self, why: str) -> None:
        out: Outbox = {}
        with self._cv:
            waiting = list(self._waiting)
            self._waiting.clear()
        for req in waiting + self._slots.active():
            if not req.cancelled:
                out.setdefault(req.loop, []).append((req, Chunk("", error=why)))
            self._slots.release(req)
        self._handoffs.deliver(out)
