"""One request inside the engine: prefill progress, its stop strings, the log-probabilities handed out with each
chunk, and the last chunk's counts (the engine tests run it on the real model)."""

from __future__ import annotations

import asyncio

import pytest

from tiergate.edge_node.engine.request import ActiveRequest, Chunk
from tiergate.edge_node.engine.sampling import SamplingParams
from tiergate.edge_node.server.logprobs import TokenLogprob

pytestmark = pytest.mark.anyio


def request(params: SamplingParams, prompt: list[int] | None = None) -> ActiveRequest:
    return ActiveRequest("r-1", prompt if prompt is not None else [1, 2, 3, 4], params, 16, "chat",
                         asyncio.get_running_loop())


async def test_a_new_request_is_prefilling_until_its_whole_prompt_is_in_the_kv_cache() -> None:
    r = request(SamplingParams())
    assert r.prefilling and r.n_prompt_done == 0 and r.slot is None and r.sampler is None
    assert not r.cancelled and r.first_token_at is None and r.admitted_at is None
    r.n_prompt_done = 3
    assert r.prefilling
    r.n_prompt_done = 4
    assert not r.prefilling
    assert not request(SamplingParams(), prompt=[]).prefilling


async def test_a_request_that_did_not_ask_for_logprobs_hands_out_none() -> None:
    r = request(SamplingParams(logprobs=None))
    assert r.logprobs is None and r.take_logprobs() is None


async def test_logprobs_are_handed_out_once_each_with_the_chunk_they_belong_to() -> None:
    r = request(SamplingParams(logprobs=2))
    a, b = TokenLogprob(1, b"a", -0.1, ()), TokenLogprob(2, b"b", -0.2, ())
    assert r.take_logprobs() == []
    assert r.logprobs is not None
    r.logprobs.extend([a, b])
    assert r.take_logprobs() == [a, b]
    assert r.take_logprobs() == []  # not twice
    r.logprobs.append(a)
    assert r.take_logprobs() == [a]


async def test_its_text_stream_holds_back_a_possible_stop_and_ends_at_it() -> None:
    r = request(SamplingParams(stop=("END",)))
    assert r.text.feed(b"Hello E") == "Hello "
    assert not r.text.stopped
    assert r.text.feed(b"ND and more") == ""
    assert r.text.stopped


async def test_requests_are_queued_on_their_own_loop_in_order() -> None:
    r = request(SamplingParams())
    assert r.loop is asyncio.get_running_loop()
    r.queue.put_nowait(Chunk("a"))
    r.queue.put_nowait(Chunk("", "stop", 4, 1, 2))
    assert (await r.queue.get()).text == "a"
    last = await r.queue.get()
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens, last.cached_tokens) == ("stop", 4, 1, 2)


def test_a_chunk_is_text_only_until_it_is_the_last() -> None:
    c = Chunk("hi")
    assert (c.finish_reason, c.prompt_tokens, c.completion_tokens, c.cached_tokens, c.error, c.logprobs) == (
        None, 0, 0, 0, None, None)


def test_a_request_takes_no_attribute_it_does_not_declare() -> None:
    r = ActiveRequest("r", [1], SamplingParams(), 1, "chat", asyncio.new_event_loop())
    try:
        with pytest.raises(AttributeError):
            r.canceled = True  # type: ignore[attr-defined]  # a misspelt flag must not be silently ignored
    finally:
        r.loop.close()
