"""The continuous-batching engine on the real llama.cpp with the tiny INT4 demo model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from tiergate.edge_node.engine.engine import (
    ContextOverflowError,
    Engine,
    EngineError,
    EngineFailedError,
    QueueFullError,
)
from tiergate.edge_node.engine.runtime import LlamaRuntime, RuntimeConfig
from tiergate.edge_node.engine.sampling import SamplerChain, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=40)


@pytest.fixture(scope="module", params=[False, True], ids=["kv-per-slot", "kv-unified"])
def engine(request, edge_model):
    rt = LlamaRuntime(RuntimeConfig(model_path=edge_model.gguf, ctx_per_seq=512, parallel=4,
                                    kv_unified=request.param))
    eng = Engine(rt, prefix_reuse_min=8, prefix_copy_min=8)
    eng.start()
    yield eng
    eng.close()


def per_slot_kv_only(engine: Engine) -> None:
    """Bit-identical outputs need per-slot KV streams: in one unified buffer a sequence's cells land at
    positions that depend on its neighbours, which changes float summation order in attention."""
    if engine.rt.cfg.kv_unified:
        pytest.skip("exact equality is only guaranteed with per-slot KV (the default)")


def chat(engine: Engine, text: str) -> list[int]:
    return engine.tokenize_chat([{"role": "user", "content": text}])


async def generate(engine: Engine, prompt: list[int], params: SamplingParams = GREEDY):
    gen = engine.submit(prompt, params)
    parts, last = [], None
    async for c in gen:
        parts.append(c.text)
        last = c
    return "".join(parts), last


def wait_idle(engine: Engine) -> None:
    """Block until the engine thread has no request (it runs on its own; no event loop needed)."""
    for _ in range(2000):
        if engine.stats().busy == 0 and engine.stats().queued == 0:
            return
        time.sleep(0.005)
    raise AssertionError("engine did not become idle")


def test_greedy_output_is_the_same_alone_and_batched(engine):
    per_slot_kv_only(engine)
    prompts = [chat(engine, t) for t in ("What is an edge node?", "Tell me a story", "2+2=?", "Translate: café")]

    async def scenario():
        alone = [await generate(engine, p) for p in prompts]
        before = engine.metrics.multi_sequence_decodes._value.get()
        together = await asyncio.gather(*(generate(engine, p) for p in prompts))
        return alone, together, engine.metrics.multi_sequence_decodes._value.get() - before

    alone, together, multi = asyncio.run(scenario())
    assert [t for t, _ in together] == [t for t, _ in alone]
    assert all(c.finish_reason == "length" and c.completion_tokens == 40 for _, c in together)
    assert multi > 0  # they really were decoded in shared batches


def test_seeds_make_sampling_reproducible_per_request(engine):
    per_slot_kv_only(engine)
    p = chat(engine, "Say something random")

    async def scenario():
        s = lambda seed: SamplingParams(temperature=1.0, top_p=0.95, top_k=50, seed=seed, max_tokens=30)
        return await asyncio.gather(generate(engine, p, s(1)), generate(engine, p, s(1)), generate(engine, p, s(2)))

    (a, _), (b, _), (c, _) = asyncio.run(scenario())
    assert a == b and a != c


def test_stop_string_ends_with_stop_and_hides_the_stop_text(engine):
    p = chat(engine, "Count with me")
    full, _ = asyncio.run(generate(engine, p))
    words = full.split()
    stop = words[len(words) // 2]
    expected = full[: full.index(stop)]
    text, last = asyncio.run(generate(engine, p, SamplingParams(temperature=0.0, max_tokens=40, stop=(stop,))))
    assert text == expected and last.finish_reason == "stop"
    assert stop not in text


def test_prompt_longer_than_context_is_refused_with_the_limit(engine):
    async def scenario():
        engine.submit(list(range(10, 10 + 600)), GREEDY)

    with pytest.raises(ContextOverflowError, match="maximum context length is 512 tokens"):
        asyncio.run(scenario())

    async def too_much():
        engine.submit(chat(engine, "hi"), SamplingParams(max_tokens=600))

    with pytest.raises(ContextOverflowError, match="you requested"):
        asyncio.run(too_much())


def test_generation_stops_at_the_context_end_with_length(engine):
    p = chat(engine, "long")
    _, last = asyncio.run(generate(engine, p, SamplingParams(temperature=0.0)))
    assert last.finish_reason == "length" and last.prompt_tokens + last.completion_tokens == 512


def test_cancel_frees_the_slot_and_stops_generation(engine):
    p = chat(engine, "Write forever")

    async def scenario():
        gen = engine.submit(p, SamplingParams(temperature=0.0))
        first = await gen.__anext__()
        busy_during = engine.stats().busy
        gen.cancel()
        for _ in range(500):
            if engine.stats().busy == 0:
                break
            await asyncio.sleep(0.01)
        return first, busy_during, engine.stats().busy

    before = engine.metrics.cancelled._value.get()
    gen_before = engine.metrics.generation_tokens._value.get()
    first, busy_during, busy_after = asyncio.run(scenario())
    assert first.finish_reason is None and busy_during == 1 and busy_after == 0
    assert engine.metrics.cancelled._value.get() == before + 1
    assert engine.metrics.generation_tokens._value.get() - gen_before < 512 - len(p)


def test_a_repeated_prompt_prefix_is_served_from_the_kv_cache(engine):
    wait_idle(engine)
    base = chat(engine, "You are a helpful assistant for the tiergate edge gateway. Question one?")
    longer = base + engine.tokenize_prompt(" And a follow-up question about caching.")[1:]

    async def scenario():
        await generate(engine, base)
        return await generate(engine, longer)

    _, last = asyncio.run(scenario())
    assert last.cached_tokens >= len(base) - 1


def test_prefix_copied_from_a_busy_slot_gives_the_same_output(engine):
    """B shares a long prefix with a request still running in another slot: its KV is copied, not recomputed.

    Prefill chunking changes float rounding, so the reference run reproduces the same batch shapes
    (prefix prefilled alone, then the tail prefilled next to one decoding request) without a copy.
    """
    shared = chat(engine, "Shared system prompt about routing requests between edge and cloud tiers, " * 3)
    tail = engine.tokenize_prompt(" Extra question.")[1:]
    long_run = SamplingParams(temperature=0.0, max_tokens=400)

    async def with_copy():
        forget_cached_prefixes(engine)
        runner = engine.submit(shared, long_run)  # prefills `shared` alone, then keeps decoding
        await runner.__anext__()
        text, last = await generate(engine, shared + tail)
        runner.cancel()
        return text, last

    async def reference():
        forget_cached_prefixes(engine)
        await generate(engine, shared, SamplingParams(temperature=0.0, max_tokens=1))  # `shared` stays in its slot
        runner = engine.submit(chat(engine, "unrelated"), long_run)
        await runner.__anext__()
        text, last = await generate(engine, shared + tail)  # reuses its own slot: no copy
        runner.cancel()
        return text, last

    copies_before = engine.metrics.prompt_tokens_cached._value.get()
    text, last = asyncio.run(with_copy())
    assert last.cached_tokens >= len(shared) - 1
    assert engine.metrics.prompt_tokens_cached._value.get() - copies_before == last.cached_tokens
    assert last.completion_tokens == 40 and text
    per_slot_kv_only(engine)
    wait_idle(engine)
    ref_text, ref_last = asyncio.run(reference())
    assert ref_last.cached_tokens == last.cached_tokens
    assert text == ref_text


def forget_cached_prefixes(engine: Engine) -> None:
    """Drop every idle slot's retained KV (test-only), so only what the test sets up can be reused."""
    wait_idle(engine)
    for s in engine._slots.slots:
        engine._slots.reset(s)


@pytest.fixture
def own_engine(edge_model):
    """A fresh engine for tests that break it (the module's shared one must stay healthy)."""
    rt = LlamaRuntime(RuntimeConfig(model_path=edge_model.gguf, ctx_per_seq=256, parallel=2))
    eng = Engine(rt)
    eng.start()
    yield eng
    eng.close()


@pytest.mark.parametrize("where", ["sample", "__init__"])
def test_a_crash_in_the_decode_loop_fails_every_request_and_refuses_new_ones(own_engine, monkeypatch, where):
    eng = own_engine

    def broken(self, *args, **kwargs):  # a bug (or a llama.cpp failure) inside the loop: on the first
        raise RuntimeError("sampler exploded")  # token, or while a request is half-way into its slot

    monkeypatch.setattr(SamplerChain, where, broken)
    told: list[str] = []
    eng.on_failure = told.append  # the CLI exits for a restart when told

    async def scenario() -> None:
        prompt = chat(eng, "hello")
        first, second = eng.submit(prompt, GREEDY), eng.submit(prompt, GREEDY)
        for gen in (first, second):  # both end with an error, neither hangs
            with pytest.raises(EngineError, match="sampler exploded"):
                async with asyncio.timeout(10):
                    async for _ in gen:
                        pass
        with pytest.raises(EngineFailedError, match="restart"):
            eng.submit(prompt, GREEDY)

    asyncio.run(scenario())
    assert not eng.alive and "sampler exploded" in eng.failure
    assert told == [eng.failure]


def test_tokens_per_second_samples_stay_bounded_without_scrapes(own_engine):
    eng = own_engine
    eng.throughput.window_s = 0.05  # samples older than this are pruned when new ones arrive

    async def scenario() -> None:
        for _ in range(6):
            await generate(eng, chat(eng, "count"), SamplingParams(temperature=0.0, max_tokens=8))
            await asyncio.sleep(0.06)

    asyncio.run(scenario())
    assert len(eng.throughput) <= 8  # one request's steps at most, not all six requests' (48)


def test_close_leaves_the_model_loaded_while_the_thread_still_runs(own_engine, monkeypatch):
    eng = own_engine
    freed: list[bool] = []
    monkeypatch.setattr(eng.rt, "close", lambda: freed.append(True))
    monkeypatch.setattr(eng, "stop", lambda timeout=10.0: None)  # as if join() had timed out mid-decode
    eng.close()
    assert freed == []  # a thread still decoding would use freed memory
    monkeypatch.undo()
    eng.close()
    assert not eng.alive


def test_close_after_a_timed_out_stop_still_waits_for_the_thread(own_engine, monkeypatch):
    """What `edge-node serve` does: the server's shutdown stops the engine (join may time out mid-decode),
    then the CLI closes it. The model must stay loaded while the thread is still inside a step."""
    eng = own_engine
    sample, in_step, leave = SamplerChain.sample, threading.Event(), threading.Event()

    def stuck(self, *args, **kwargs):  # a decode step that outlasts the join timeout
        in_step.set()
        leave.wait(10)
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(SamplerChain, "sample", stuck)
    freed: list[bool] = []
    monkeypatch.setattr(eng.rt, "close", lambda: freed.append(True))

    async def scenario() -> None:
        eng.submit(chat(eng, "hello"), GREEDY)
        assert await asyncio.to_thread(in_step.wait, 10)
        eng.stop(timeout=0.01)
        monkeypatch.setattr(eng, "stop", lambda timeout=10.0: None)  # close()'s own join times out too
        eng.close()

    asyncio.run(scenario())
    assert freed == []  # the thread is still sampling: freeing now would be a use-after-free
    leave.set()
    eng._thread.join(10)
    eng.close()  # the thread has exited now: the model is freed
    assert freed == [True]


@pytest.mark.parametrize("max_queue", [0, 1])
def test_the_queue_bound_counts_only_requests_that_cannot_get_a_slot(own_engine, max_queue):
    """Free slots take requests whatever the bound (--max-queue 0 still serves `parallel` at once); past
    the slots, `max_queue` more may wait and the next is refused, even before the engine has admitted any."""
    eng = own_engine
    eng.max_queue = max_queue
    no_end = {t: float("-inf") for t in range(eng.rt.n_vocab) if eng.rt.is_eog(t)}
    endless = SamplingParams(temperature=0.0, logit_bias=no_end)  # to the end of the context: none finishes here

    async def scenario() -> int:
        prompt = chat(eng, "hold a slot")
        held = [eng.submit(prompt, endless) for _ in range(eng.parallel + max_queue)]
        try:
            with pytest.raises(QueueFullError, match=f"--max-queue {max_queue}"):
                eng.submit(prompt, endless)
            return len(held)
        finally:
            for gen in held:
                gen.cancel()

    assert asyncio.run(scenario()) == eng.parallel + max_queue
    wait_idle(eng)
