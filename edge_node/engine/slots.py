"""The engine's slots: one llama.cpp sequence each, and the prompt-prefix reuse that picks one for a request.

A slot keeps the KV of its last request after it finishes, so a later request sharing a prefix (same system
prompt, a chat turn that extends the previous one) skips that part of the prefill; a prefix held by another
slot is copied with `llama_memory_seq_cp` when that saves enough work. Runs on the decode thread only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tiergate.edge_node.engine.request import ActiveRequest
from tiergate.edge_node.engine.runtime import LlamaRuntime

__all__ = ["PREFIX_COPY_MIN", "PREFIX_REUSE_MIN", "Slot", "SlotTable"]

# Shared prompt tokens worth keeping in a slot (reuse) or copying from another slot (copy). Copying was once
# held to 32 tokens, which missed the chat template and system prompt most requests share (~30 tokens with
# SmolLM2's default template): the first burst after start then prefilled them once per slot. A whole-stream
# copy costs a memory copy of one slot's KV (a few ms on CPU, less on a GPU); 16 tokens of prefill cost
# ~80 ms here (bench/edge, 1 thread), and far more than the copy on any device we target.
PREFIX_REUSE_MIN = 16
PREFIX_COPY_MIN = 16


class Slot:
    __slots__ = ("last_used", "request", "seq", "tokens")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.tokens: list[int] = []  # exactly the tokens whose KV this sequence holds, by position
        self.request: ActiveRequest | None = None
        self.last_used = 0.0


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class SlotTable:
    """Every slot of one llama_context, which ones are busy, and where a new request goes."""

    def __init__(self, runtime: LlamaRuntime, *, prefix_reuse_min: int = PREFIX_REUSE_MIN,
                 prefix_copy_min: int = PREFIX_COPY_MIN) -> None:
        self.rt = runtime
        self.slots = [Slot(i) for i in range(runtime.n_seq_max)]
        self.busy = 0
        self._prefix_reuse_min = prefix_reuse_min
        self._prefix_copy_min = prefix_copy_min

    def free(self) -> list[Slot]:
        return [s for s in self.slots if s.request is None]

    def active(self) -> list[ActiveRequest]:
        return [s.request for s in self.slots if s.request is not None]

    def kv_used(self) -> int:
        return sum(len(s.tokens) for s in self.slots)

    def prepare(self, req: ActiveRequest, free: list[Slot]) -> Slot:
        """Choose a free slot for `req` and set its KV up to the longest prefix worth keeping or copying.

        Sets how much of the prompt is already in the cache (`n_prompt_done`, `cached`); the request is not in
        the slot yet (`occupy`)."""
        fast, mem = self.rt.fast, self.rt.memory
        prompt = req.prompt
        limit = len(prompt) - 1  # at least one prompt token must be decoded to get logits

        # One KV buffer for all slots (kv_unified) decodes any mix of sequences together: no runs to keep.
        busy = set() if self.rt.cfg.kv_unified else {s.seq for s in self.slots if s.request is not None}

        def score(s: Slot) -> tuple[int, int, int, float]:
            # Reuse a slot's cache when it shares enough. Otherwise keep the busy sequence ids in as few
            # consecutive runs as possible: with a KV stream per slot, llama.cpp decodes only consecutive
            # sequence ids together (llama_batch_allocr::split_equal, sequential), so every extra run is one more
            # pass over the weights per step. Then the slot with the least cached (least recently used on
            # ties), so useful prefixes survive for later requests.
            common = min(_common_prefix(s.tokens, prompt), limit)
            useful = common if common >= self._prefix_reuse_min else 0
            new_runs = (1 - ((s.seq - 1) in busy) - ((s.seq + 1) in busy)) if busy else 0
            return useful, -new_runs, -len(s.tokens), -s.last_used

        slot = max(free, key=score)
        own = min(_common_prefix(slot.tokens, prompt), limit)
        donor, donor_len = None, own
        for s in self.slots:
            if s is slot or len(s.tokens) <= donor_len + self._prefix_copy_min:
                continue
            n = min(_common_prefix(s.tokens, prompt), limit)
            if n >= donor_len + self._prefix_copy_min:
                donor, donor_len = s, n
        if donor is not None:
            if self.rt.cfg.kv_unified:
                fast.memory_seq_rm(mem, slot.seq, -1, -1)
                fast.memory_seq_cp(mem, donor.seq, slot.seq, 0, donor_len)
            else:  # separate streams: llama.cpp copies whole sequences only, then we trim
                fast.memory_seq_cp(mem, donor.seq, slot.seq, -1, -1)
                fast.memory_seq_rm(mem, slot.seq, donor_len, -1)
            slot.tokens = donor.tokens[:donor_len]
            reused = donor_len
        else:
            if not fast.memory_seq_rm(mem, slot.seq, own, -1):
                fast.memory_seq_rm(mem, slot.seq, -1, -1)
                own = 0
            del slot.tokens[own:]
            reused = own
        req.n_prompt_done = reused
        req.cached = reused
        return slot

    def occupy(self, slot: Slot, req: ActiveRequest) -> None:
        slot.request = req
        req.slot = slot
        req.admitted_at = time.monotonic()
        self.busy += 1

    def release(self, req: ActiveRequest) -> None:
        """Free the request's slot (its KV stays for later prefix reuse) and its sampler."""
        slot = req.slot
        if slot is not None:
            slot.request = None
            slot.last_used = time.monotonic()
            self.busy -= 1
            req.slot = None
        if req.sampler is not None:
            req.sampler.free()
            req.sampler = None

    def reset(self, slot: Slot) -> None:
        """Forget a slot's KV (after a failed decode)."""
        self.rt.fast.memory_seq_rm(self.rt.memory, slot.seq, -1, -1)
        slot.tokens = []
