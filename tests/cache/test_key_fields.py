"""Property: change one answer-relevant field of a cached request and the cache must not answer it (issue 39).

A stored answer is served only to a request that would get the same answer. So for a request whose answer is in
the cache (stored under the gateway's routing decision), each field that can change the answer is changed alone,
to any other value, and the lookup must not hit, neither exactly nor semantically (the question text stays the
same, so a semantic lookup that looked in the same namespace would find it at similarity 1.0). The real
embedder and the in-process store: the lookups are the ones the gateway makes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cache.helpers import RULE, SETTINGS, answer
from tiergate.cache import build_cache
from tiergate.cache.keys import Route
from tiergate.core.wire import ChatRequest, CompletionRequest, Message, ParsedRequest

QUESTION = "How do I invest my money wisely?"
ROUTE = Route(("edge",), 16)
ANSWER = answer("Diversify and hold.", finish_reason="length", completion_tokens=16)  # cut at the budget

# The base request: every answer-relevant field set, so that removing one is a change too.
BASE_CHAT: dict[str, Any] = {
    "model": "auto", "temperature": 0.0, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 1, "stop": ["\n\n"],
    "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"42": 1.0},
    "response_format": {"type": "text"}, "max_tokens": 16,
}
SYSTEM, NAME = "You are terse.", "alice"
BASE_TEXT: dict[str, Any] = {k: v for k, v in BASE_CHAT.items() if k not in ("response_format",)} | {
    "echo": False, "suffix": "."}


def _chat(fields: dict[str, Any], *, system: str | None = SYSTEM, history: bool = False,
          name: str | None = NAME) -> ChatRequest:
    msgs = [Message(role="system", content=system)] if system is not None else []
    if history:
        msgs += [Message(role="user", content="Hi"), Message(role="assistant", content="Hello.")]
    msgs.append(Message(role="user", content=QUESTION, name=name))
    return ChatRequest(messages=msgs, **fields)


def _text(fields: dict[str, Any]) -> CompletionRequest:
    return CompletionRequest(prompt=QUESTION, **fields)


_small = st.integers(1, 30).map(lambda i: i / 100)  # a temperature the rule still caches (max 0.3), never 0.0
_word = st.text("abcdefghij", min_size=1, max_size=6)

# field name -> a strategy for a (request, tenant, route) that differs from the base in that one field only
Mutation = Callable[[st.DataObject], tuple[ParsedRequest, str, Route]]


def _param(kind: str, name: str, values: st.SearchStrategy[Any]) -> Mutation:
    base = BASE_CHAT if kind == "chat" else BASE_TEXT
    make = _chat if kind == "chat" else _text

    def mutate(data: st.DataObject) -> tuple[ParsedRequest, str, Route]:
        value = data.draw(values.filter(lambda v: v != base.get(name)), label=name)
        fields = {k: v for k, v in base.items() if k != name} | ({} if value is None else {name: value})
        return make(fields), "t", ROUTE

    return mutate


def _chat_with(**kw: Any) -> Mutation:
    return lambda data: (_chat(BASE_CHAT, **{k: data.draw(v, label=k) for k, v in kw.items()}), "t", ROUTE)


MUTATIONS: dict[str, Mutation] = {
    "tenant": lambda data: (_chat(BASE_CHAT), data.draw(_word.filter(lambda t: t != "t"), label="tenant"), ROUTE),
    "tiers": lambda data: (_chat(BASE_CHAT), "t", Route(data.draw(st.sampled_from(
        [("cloud",), ("edge", "cloud"), ("cloud", "edge")]), label="tiers"), ROUTE.max_tokens)),
    "budget": lambda data: (_chat(BASE_CHAT), "t", Route(ROUTE.tiers, data.draw(
        st.one_of(st.none(), st.integers(1, 4096).filter(lambda n: n != 16)), label="budget"))),
    "system": _chat_with(system=st.one_of(st.none(), _word)),
    "history": _chat_with(history=st.just(True)),
    "name": _chat_with(name=st.one_of(st.none(), _word.filter(lambda n: n != NAME))),
    "model": _param("chat", "model", st.sampled_from(["tiergate-edge", "tiergate-cloud"])),
    "temperature": _param("chat", "temperature", _small),
    "top_p": _param("chat", "top_p", st.one_of(st.none(), _small)),
    "top_k": _param("chat", "top_k", st.one_of(st.none(), st.integers(1, 100))),
    "min_p": _param("chat", "min_p", st.one_of(st.none(), _small)),
    "seed": _param("chat", "seed", st.one_of(st.none(), st.integers(0, 2**31))),
    "stop": _param("chat", "stop", st.one_of(st.none(), _word, st.lists(_word, min_size=1, max_size=3))),
    "presence_penalty": _param("chat", "presence_penalty", st.one_of(st.none(), _small)),
    "frequency_penalty": _param("chat", "frequency_penalty", st.one_of(st.none(), _small)),
    "repetition_penalty": _param("chat", "repetition_penalty", st.one_of(st.none(), _small)),
    "logit_bias": _param("chat", "logit_bias", st.one_of(st.none(), st.dictionaries(
        st.integers(0, 50_000).map(str), st.integers(-100, 100).map(float), min_size=1, max_size=3))),
    "response_format": _param("chat", "response_format", st.one_of(st.none(), st.just({"type": "json_object"}))),
    "logprobs": _param("chat", "logprobs", st.just(True)),
    "text logprobs": _param("text", "logprobs", st.integers(0, 5)),  # logprobs: 0 too
    "text echo": _param("text", "echo", st.one_of(st.none(), st.just(True))),
    "text suffix": _param("text", "suffix", st.one_of(st.none(), _word)),
    "text temperature": _param("text", "temperature", _small),
    # several answers: never looked up or stored (the gateway sends each as a request of its own: gateway.fanout)
    "n": _param("chat", "n", st.integers(2, 128)),
    "text n": _param("text", "n", st.integers(2, 128)),
    "text prompt list": lambda data: (CompletionRequest(prompt=data.draw(st.lists(
        st.one_of(st.just(QUESTION), _word), min_size=2, max_size=5).map(lambda p: [*p, QUESTION]),
        label="prompts"), **BASE_TEXT), "t", ROUTE),
}
BYPASSED = {"logprobs", "text logprobs", "n", "text n", "text prompt list"}  # uncacheable: not even looked up


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def cache(onnx_embedder, loop):
    """One cache holding the base chat and completion answers (each example only looks up)."""
    cache = build_cache(None, None, embedder=onnx_embedder, settings=SETTINGS)

    async def fill() -> None:
        await cache.start()
        for req in (_chat(BASE_CHAT), _text(BASE_TEXT)):
            assert await cache.store(req, "t", RULE, ANSWER if req.kind == "chat" else msgspec.structs.replace(
                ANSWER, kind="text"), route=ROUTE)
            assert (await cache.check(req, "t", RULE, route=ROUTE)).status == "hit-exact"

    loop.run_until_complete(fill())
    yield cache
    loop.run_until_complete(cache.stop())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(MUTATIONS)), data=st.data())
def test_changing_one_answer_relevant_field_never_hits(cache, loop, field: str, data: st.DataObject) -> None:
    req, tenant, route = MUTATIONS[field](data)
    result = loop.run_until_complete(cache.check(req, tenant, RULE, route=route))
    assert result.hit is None, (field, result.status, result.hit)
    assert result.status == ("bypass" if field in BYPASSED else "miss"), field


def test_every_mutation_is_tried() -> None:
    """The strategies stay in step with the key: each answer-relevant parameter has its mutation."""
    from tiergate.cache.keys import _ANSWER_PARAMS

    covered = {f.removeprefix("text ") for f in MUTATIONS}
    assert set(_ANSWER_PARAMS) - {"tools", "tool_choice", "best_of"} <= covered  # tools bypass; best_of > 1 is "n"


def test_an_answer_from_a_fallback_tier_is_not_stored(cache, loop) -> None:
    """The decision said edge, the edge failed, the cloud answered: that answer does not stand for the edge."""
    req = _chat(BASE_CHAT | {"seed": 99})
    fallback = msgspec.structs.replace(ANSWER, tier="cloud")
    assert not loop.run_until_complete(cache.store(req, "t", RULE, fallback, route=ROUTE))
    assert loop.run_until_complete(cache.check(req, "t", RULE, route=ROUTE)).status == "miss"
    assert loop.run_until_complete(cache.store(req, "t", RULE, ANSWER, route=ROUTE))
    cascade = Route(("edge", "cloud"), ROUTE.max_tokens)  # a cascade's escalated answer is its own answer
    assert loop.run_until_complete(cache.store(req, "t", RULE, fallback, route=cascade))
