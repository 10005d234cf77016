"""One decode step of the continuous batch, driven step by step on the real llama.cpp with the tiny demo model:
prompts prefilled in `n_batch` chunks, generating slots first, several sequences in one `llama_decode`, requests
finished with their counts, and a refused batch failing only the requests inside it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tiergate.edge_node.engine.batch import Batch, DecodeStep
from tiergate.edge_node.engine.request import ActiveRequest, Chunk
from tiergate.edge_node.engine.runtime import LlamaRuntime, RuntimeConfig
from tiergate.edge_node.engine.sampling import SamplerChain, SamplingParams
from tiergate.edge_node.engine.slots import SlotTable
from tiergate.edge_node.server.metrics import EdgeMetrics

N_BATCH = 16


@pytest.fixture(scope="module")
def runtime(edge_model) -> Iterator[LlamaRuntime]:
    rt = LlamaRuntime(RuntimeConfig(model_path=edge_model.gguf, ctx_per_seq=256, parallel=2, n_batch=N_BATCH,
                                    check_memory=False))
    yield rt
    rt.close()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    lp = asyncio.new_event_loop()  # only a key of the outbox here: never run
    yield lp
    lp.close()


class Step:
    def __init__(self, rt: LlamaRuntime, loop: asyncio.AbstractEventLoop) -> None:
        self.rt, self.loop = rt, loop
        self.slots = SlotTable(rt, prefix_reuse_min=10**6, prefix_copy_min=10**6)  # no KV reuse: fresh each time
        for slot in self.slots.slots:
            self.slots.reset(slot)
        self.metrics = EdgeMetrics()
        self.step = DecodeStep(rt, self.slots, self.metrics)

    def admit(self, prompt: list[int], max_new: int, **params: object) -> ActiveRequest:
        """As the engine admits a request: a sampler chain, a slot."""
        p = SamplingParams(temperature=0.0, **params)  # type: ignore[arg-type]
        req = ActiveRequest(f"r{len(self.slots.active())}", prompt, p, max_new, "completions", self.loop)
        req.sampler = SamplerChain(self.rt.llama, p, self.rt.n_vocab, sample_fn=self.rt.fast.sampler_sample,
                                   vocab=self.rt.vocab)
        self.slots.occupy(self.slots.prepare(req, self.slots.free()), req)
        return req

    def run(self) -> tuple[int, list[tuple[ActiveRequest, Chunk]]]:
        out: dict = {}
        n = self.step.run(out)
        assert set(out) <= {self.loop}
        return n, out.get(self.loop, [])

    def value(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def prompt(rt: LlamaRuntime, n: int) -> list[int]:
    tokens = rt.tokenize("the quick brown fox jumps over the lazy dog " * 20, add_bos=True)
    assert len(tokens) >= n
    return tokens[:n]


def test_the_llama_batch_reads_the_numpy_buffers_it_was_built_on(runtime) -> None:
    b = Batch(runtime.llama, 4)
    b.token[:3] = [7, 8, 9]
    b.pos[:3] = [0, 1, 2]
    b.seq[:3] = [1, 0, 1]
    b.logits[:3] = [0, 0, 1]
    s = b.struct
    assert [s.token[i] for i in range(3)] == [7, 8, 9] and [s.pos[i] for i in range(3)] == [0, 1, 2]
    assert [s.seq_id[i][0] for i in range(3)] == [1, 0, 1] and [s.n_seq_id[i] for i in range(4)] == [1] * 4
    assert [s.logits[i] for i in range(3)] == [0, 0, 1] and not s.embd


def test_an_empty_table_decodes_nothing(runtime, loop) -> None:
    st = Step(runtime, loop)
    assert st.run() == (0, [])
    assert st.value("tiergate_edge_decode_calls_total") == 0


def test_a_long_prompt_is_prefilled_in_n_batch_chunks_then_generates_until_its_budget(runtime, loop) -> None:
    st = Step(runtime, loop)
    req = st.admit(prompt(runtime, 40), max_new=3)
    progress = []
    for _ in range(2):
        assert st.run() == (0, [])  # no logits asked for yet: nothing sampled
        progress.append(req.n_prompt_done)
    assert progress == [16, 32] and req.prefilling and req.first_token_at is None
    generated, chunks = st.run()  # the last 8 prompt tokens, and the first token sampled from their last row
    assert generated == 1 and not req.prefilling and req.first_token_at is not None
    texts = [c for _, c in chunks]
    while req.slot is not None:
        n, out = st.run()
        assert n == 1
        texts += [c for _, c in out]
    last = texts[-1]
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens, last.cached_tokens) == ("length", 40, 3, 0)
    assert all(c.finish_reason is None for c in texts[:-1])
    assert req.sampler is None and st.slots.busy == 0  # released
    assert st.value("tiergate_edge_generation_tokens_total") == 3
    assert st.value("tiergate_edge_requests_total", endpoint="completions", finish_reason="length") == 1
    assert st.value("tiergate_edge_batch_tokens_sum") == 40 + 2  # 40 prompt tokens, then one per later step
    assert st.value("tiergate_edge_time_to_first_token_seconds_count") == 1


def test_generating_slots_go_first_and_share_the_decode_with_a_prefill(runtime, loop) -> None:
    st = Step(runtime, loop)
    first = st.admit(prompt(runtime, 8), max_new=50)
    st.run()  # prefilled, first token sampled: now generating
    assert not first.prefilling
    second = st.admit(prompt(runtime, 40), max_new=50)
    st.run()
    # one token for the generating slot, the rest of the batch for the prefill
    assert second.n_prompt_done == N_BATCH - 1
    assert first.n_generated == 2
    assert st.value("tiergate_edge_multi_sequence_decodes_total") == 1
    assert st.value("tiergate_edge_batch_sequences_bucket", le="2.0") - \
        st.value("tiergate_edge_batch_sequences_bucket", le="1.0") == 1
    for req in (first, second):
        st.slots.release(req)


def test_logprobs_are_read_for_the_tokens_of_a_request_that_asked(runtime, loop) -> None:
    st = Step(runtime, loop)
    req = st.admit(prompt(runtime, 8), max_new=2, logprobs=3)
    chunks = []
    while req.slot is not None:
        chunks += [c for _, c in st.run()[1]]
    lps = [t for c in chunks for t in (c.logprobs or [])]
    assert len(lps) == 2 and all(len(t.top) == 3 and t.logprob <= 0 for t in lps)
    assert all(t.top[0][2] >= t.logprob for t in lps)  # greedy: the chosen token is the most likely
    assert "".join(c.text for c in chunks) == b"".join(t.piece for t in lps).decode(errors="replace")


def test_a_refused_batch_fails_its_requests_and_forgets_their_kv(runtime, loop) -> None:
    st = Step(runtime, loop)
    bad = prompt(runtime, 8)
    bad[4] = runtime.n_vocab + 5  # a token the model does not have: llama_decode refuses the batch
    req = st.admit(bad, max_new=5)
    slot = req.slot
    assert slot is not None
    generated, out = st.run()
    assert generated == 0
    [(failed, chunk)] = out
    assert failed is req and chunk.error and chunk.finish_reason is None
    assert slot.tokens == [] and slot.request is None and req.sampler is None
    assert st.value("tiergate_edge_request_errors_total", code="decode_failed") == 1
    ok = st.admit(prompt(runtime, 8), max_new=1)  # the slot serves again
    while ok.slot is not None:
        st.run()
    assert st.value("tiergate_edge_requests_total", endpoint="completions", finish_reason="length") == 1
