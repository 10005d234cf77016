"""Third-party Python clients nobody here wrote, pointed at the gateway as an app developer would: LangChain's
`ChatOpenAI` agent loop with `bind_tools`, instructor in TOOLS and JSON_SCHEMA modes, and litellm as a client
(`openai/` against /v1/chat/completions, `anthropic/` against /v1/messages). Versions: pyproject.toml's dev extra.

Behind the gateway is a real SmolLM2-135M-Instruct edge node. Each answer is checked against what the gateway gives
for the same request sent by hand (greedy, so the same pipeline must give the same text and the same tool call): a
client that sent something else, or read the answer wrong, fails here. What reached the gateway is read from its
headers and metrics (the tier, the endpoint), what the client sent from the request itself.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Iterator
from enum import StrEnum
from typing import Any

import httpx
import instructor
import litellm
import openai
import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from tests.gateway.conftest import write_policy
from tests.support.clients import (
    CAPITAL_PROMPT,
    CAPITAL_QUESTION,
    KEY,
    WEATHER_PROMPT,
    WEATHER_TOOL,
    CityCountry,
    Wire,
    get_weather,
)
from tests.support.edge import EdgeProcess, parse_metrics, smollm2_node
from tests.support.servers import ThreadedGateway, gateway_server
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.clients, pytest.mark.timeout(600),
              # litellm's own types, as pydantic builds them on import: nothing the tests can act on
              pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")]

@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with smollm2_node(tmp_path_factory.mktemp("smollm2")) as n:
        yield n


@pytest.fixture(scope="module")
def gw(node: EdgeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedGateway]:
    """No cache, so every answer comes from the edge node; `claude-*` names the edge, as for a drop-in client."""
    policy = write_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", [node.url], ["http://127.0.0.1:9"],
                          fallback=False, cache=False, first_byte_s=120, total_s=300)
    policy.write_text(policy.read_text() + 'model_aliases:\n  "claude-*": edge\n')
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as g:
        yield g


def _chat(gw: ThreadedGateway, **body: Any) -> dict[str, Any]:
    """The gateway's answer to the request sent by hand: the reference each client's answer must equal."""
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=120,
                   json={"model": "auto", "temperature": 0, **body})
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == "edge"
    return r.json()


def _requests(gw: ThreadedGateway, endpoint: str) -> float:
    samples = parse_metrics(httpx.get(gw.url + "/metrics").text)
    return sum(v for (name, labels), v in samples.items() if name == "tiergate_requests_total"
               and dict(labels).get("endpoint") == endpoint and dict(labels).get("tier") == "edge"
               and dict(labels).get("status") == "200")


def _tool_turn(call_id: str, arguments: dict[str, Any], result: str) -> list[dict[str, Any]]:
    """The assistant's tool call and the tool's result, in OpenAI's chat shape, as written by hand."""
    return [{"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps(arguments)}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result}]


# ---- LangChain: ChatOpenAI with bind_tools ------------------------------------------------------------------------

def _langchain(gw: ThreadedGateway, wire: Wire, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=gw.url + "/v1", api_key=KEY, model="auto", temperature=0, max_tokens=48,
                      max_retries=0, include_response_headers=True, http_client=wire.client(),
                      http_async_client=wire.async_client(), **kw)


def test_langchain_agent_loop_runs_the_tool_and_answers_with_its_result(gw: ThreadedGateway) -> None:
    """Two turns of an agent loop: the model calls `get_weather`, the test runs it and sends the ToolMessage back,
    the model answers in text.

    The first turn is forced (`tool_choice="any"`, which LangChain sends as `required`): with `auto` a 135M model
    answers in text and never picks the tool. The second turn keeps the tool bound with no `tool_choice` (OpenAI's
    `auto`), as every agent loop's follow-up does, and the model answers in text from the tool's result."""
    wire = Wire()
    llm = _langchain(gw, wire)
    messages: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    first = llm.bind_tools([get_weather], tool_choice="any").invoke(messages)
    assert isinstance(first, AIMessage)
    assert wire.sent[-1]["tool_choice"] == "required"
    assert [t["function"]["name"] for t in wire.sent[-1]["tools"]] == ["get_weather"]
    assert first.response_metadata["headers"]["x-tiergate-tier"] == "edge"
    assert first.response_metadata["finish_reason"] == "tool_calls"
    reference = _chat(gw, messages=[{"role": "user", "content": WEATHER_PROMPT}], tools=[WEATHER_TOOL],
                      tool_choice="required", max_tokens=48)["choices"][0]["message"]["tool_calls"][0]["function"]
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["args"] == json.loads(reference["arguments"])
    assert "Paris" in call["args"]["city"]

    result = get_weather.invoke(call["args"])
    messages += [first, ToolMessage(result, tool_call_id=call["id"])]
    second = llm.bind_tools([get_weather]).invoke(messages)
    assert isinstance(second, AIMessage)
    sent = wire.sent[-1]
    assert "tool_choice" not in sent and sent["tools"]  # auto, with the tool still bound
    assert sent["messages"][-1] == {"role": "tool", "tool_call_id": call["id"], "content": result}
    assert second.response_metadata["headers"]["x-tiergate-tier"] == "edge"
    expected = _chat(gw, max_tokens=48, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": WEATHER_PROMPT}, *_tool_turn(call["id"], call["args"], result)])
    assert not second.tool_calls and second.content == expected["choices"][0]["message"]["content"]
    assert "24" in str(second.content)  # the answer is built from the tool's result
    assert second.usage_metadata is not None
    assert second.usage_metadata["output_tokens"] == expected["usage"]["completion_tokens"]


def test_langchain_stream_assembles_the_tool_call_chunks_and_the_answer(gw: ThreadedGateway) -> None:
    """`.stream` of both turns: LangChain assembles the tool call from its chunks (the first turn forced by naming
    the function, see above), then the text and, with `stream_usage`, the usage of the answer."""
    wire = Wire()
    llm = _langchain(gw, wire, stream_usage=True)
    messages: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    chunks = list(llm.bind_tools([get_weather], tool_choice="get_weather").stream(messages))
    assert wire.sent[-1]["stream"] is True
    assert wire.sent[-1]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert any(isinstance(c, AIMessageChunk) and c.tool_call_chunks for c in chunks)
    first = sum(chunks[1:], chunks[0])
    assert isinstance(first, AIMessageChunk)
    assert first.response_metadata["headers"]["x-tiergate-tier"] == "edge"
    assert first.response_metadata["finish_reason"] == "tool_calls"
    reference = _chat(gw, messages=[{"role": "user", "content": WEATHER_PROMPT}], tools=[WEATHER_TOOL],
                      tool_choice={"type": "function", "function": {"name": "get_weather"}},
                      max_tokens=48)["choices"][0]["message"]["tool_calls"][0]["function"]
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and call["args"] == json.loads(reference["arguments"])

    result = get_weather.invoke(call["args"])
    messages += [first, ToolMessage(result, tool_call_id=call["id"])]
    answer_chunks = list(llm.bind_tools([get_weather]).stream(messages))
    assert wire.sent[-1]["stream_options"] == {"include_usage": True}
    answer = sum(answer_chunks[1:], answer_chunks[0])
    expected = _chat(gw, max_tokens=48, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": WEATHER_PROMPT}, *_tool_turn(call["id"], call["args"], result)])
    assert len([c for c in answer_chunks if c.content]) > 1  # streamed, not one block
    assert not answer.tool_calls and answer.content == expected["choices"][0]["message"]["content"]
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == expected["usage"]["completion_tokens"]
    assert answer.usage_metadata["input_tokens"] == expected["usage"]["prompt_tokens"]


def test_langchain_agent_loop_over_the_responses_api(gw: ThreadedGateway) -> None:
    """`use_responses_api=True`: the same two turns through /v1/responses (LangChain sends the call as a
    `function_call` item and the result as `function_call_output`); the answer is the chat answer to the same
    conversation. The first turn is forced, as above."""
    wire = Wire()
    llm = _langchain(gw, wire, use_responses_api=True)
    before = _requests(gw, "responses")
    messages: list[BaseMessage] = [HumanMessage(WEATHER_PROMPT)]
    first = llm.bind_tools([get_weather], tool_choice="any").invoke(messages)
    assert isinstance(first, AIMessage) and wire.sent[-1]["tool_choice"] == "required"
    (call,) = first.tool_calls
    assert call["name"] == "get_weather" and "Paris" in call["args"]["city"]

    result = get_weather.invoke(call["args"])
    messages += [first, ToolMessage(result, tool_call_id=call["id"])]
    second = llm.bind_tools([get_weather]).invoke(messages)
    sent = wire.sent[-1]
    assert "tool_choice" not in sent
    assert sent["input"][-1] == {"type": "function_call_output", "call_id": call["id"], "output": result}
    expected = _chat(gw, max_tokens=48, tools=[WEATHER_TOOL], messages=[
        {"role": "user", "content": WEATHER_PROMPT}, *_tool_turn(call["id"], call["args"], result)])
    assert not second.tool_calls and second.text == expected["choices"][0]["message"]["content"]
    assert all(h["x-tiergate-tier"] == "edge" for h in wire.headers)
    assert _requests(gw, "responses") == before + 2


def test_langchain_async_agent_turn(gw: ThreadedGateway) -> None:
    """`ainvoke` and `astream` (LangGraph's agents run async): the same forced call as the sync client's."""
    wire = Wire()
    bound = _langchain(gw, wire).bind_tools([get_weather], tool_choice="any")

    async def both() -> tuple[AIMessage, AIMessageChunk]:
        called = await bound.ainvoke([HumanMessage(WEATHER_PROMPT)])
        chunks = [c async for c in bound.astream([HumanMessage(WEATHER_PROMPT)])]
        assert isinstance(called, AIMessage)
        return called, sum(chunks[1:], chunks[0])

    called, streamed = asyncio.run(both())
    assert len(wire.sent) == 2 and all(h["x-tiergate-tier"] == "edge" for h in wire.headers)
    assert called.tool_calls[0]["args"] == streamed.tool_calls[0]["args"]
    assert called.tool_calls[0]["name"] == streamed.tool_calls[0]["name"] == "get_weather"


# ---- instructor: TOOLS and JSON_SCHEMA ----------------------------------------------------------------------------

class Unit(StrEnum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class WeatherQuery(BaseModel):
    """An enum field: pydantic writes the schema with `$defs` and a `$ref` to it."""

    city: str
    unit: Unit


WEATHER_QUESTION = [{"role": "user", "content": "Weather in Paris, in celsius"}]


def _instructor(gw: ThreadedGateway, wire: Wire, mode: instructor.Mode) -> instructor.Instructor:
    return instructor.from_openai(openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0,
                                                http_client=wire.client()), mode=mode)


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA], ids=lambda m: m.name)
def test_instructor_validates_the_models_answer(gw: ThreadedGateway, mode: instructor.Mode) -> None:
    wire = Wire()
    client = _instructor(gw, wire, mode)
    answer, completion = client.chat.completions.create_with_completion(
        model="auto", response_model=CityCountry, messages=CAPITAL_QUESTION, temperature=0, max_tokens=64,
        max_retries=0)
    sent = wire.sent[-1]
    if mode is instructor.Mode.TOOLS:
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "CityCountry"}}
        assert completion.choices[0].finish_reason == "tool_calls"
    else:
        assert sent["response_format"]["type"] == "json_schema" and "tools" not in sent
        assert completion.choices[0].finish_reason == "stop"
    assert wire.headers[-1]["x-tiergate-tier"] == "edge"
    assert isinstance(answer, CityCountry)
    assert (answer.capital, answer.country) == ("Paris", "France")

    # A schema with `$defs` (an enum): instructor sends pydantic's schema as it is.
    query = client.chat.completions.create(model="auto", response_model=WeatherQuery, messages=WEATHER_QUESTION,
                                           temperature=0, max_tokens=64, max_retries=0)
    sent_schema = (wire.sent[-1]["tools"][0]["function"]["parameters"] if mode is instructor.Mode.TOOLS
                   else wire.sent[-1]["response_format"]["json_schema"]["schema"])
    assert "$defs" in sent_schema and "$ref" in json.dumps(sent_schema)
    assert isinstance(query, WeatherQuery) and "Paris" in query.city and query.unit is Unit.celsius


def test_instructor_partial_streams_build_the_model_up(gw: ThreadedGateway) -> None:
    """`create_partial`: in JSON_SCHEMA mode the text streams, so the fields fill in over many partial objects,
    ending at the answer the same request gets whole; in TOOLS mode the edge sends a tool call whole, in one
    chunk, so the stream's one partial object is already complete."""
    wire = Wire()
    whole = _instructor(gw, wire, instructor.Mode.JSON_SCHEMA).chat.completions.create(
        model="auto", response_model=CityCountry, messages=CAPITAL_QUESTION, temperature=0, max_tokens=64, max_retries=0)
    partials = list(_instructor(gw, wire, instructor.Mode.JSON_SCHEMA).chat.completions.create_partial(
        model="auto", response_model=CityCountry, messages=CAPITAL_QUESTION, temperature=0, max_tokens=64, max_retries=0))
    assert wire.sent[-1]["stream"] is True
    assert len(partials) > 2
    assert partials[0].capital is None and partials[0].country is None
    assert (partials[-1].capital, partials[-1].country) == (whole.capital, whole.country) == ("Paris", "France")
    seen = [p.capital for p in partials if p.capital]
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:], strict=False))

    streamed = list(_instructor(gw, wire, instructor.Mode.TOOLS).chat.completions.create_partial(
        model="auto", response_model=CityCountry, messages=CAPITAL_QUESTION, temperature=0, max_tokens=64, max_retries=0))
    assert wire.sent[-1]["stream"] is True and wire.sent[-1]["tools"]
    assert streamed and CityCountry.model_validate(streamed[-1].model_dump()).capital == "Paris"


# ---- litellm as a client ------------------------------------------------------------------------------------------

def _tier(response: Any) -> str:
    return str(response._hidden_params["additional_headers"]["llm_provider-x-tiergate-tier"])


def _text_of(chunks: Iterable[Any]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


OPENAI_ROUTE = {"model": "openai/auto", "api_key": KEY, "temperature": 0}
# The gateway's alias `claude-*` maps litellm's own Anthropic model name to the edge tier.
ANTHROPIC_ROUTE = {"model": "anthropic/claude-3-5-haiku-latest", "api_key": KEY, "temperature": 0}


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_plain_and_streamed_answers_with_usage(gw: ThreadedGateway, route: str) -> None:
    """`openai/` reaches /v1/chat/completions, `anthropic/` reaches /v1/messages: the same answer and usage as the
    chat request by hand, whole, streamed (`include_usage`) and through `acompletion`."""
    kw = ({**OPENAI_ROUTE, "api_base": gw.url + "/v1"} if route == "openai"
          else {**ANTHROPIC_ROUTE, "api_base": gw.url})
    endpoint = "chat" if route == "openai" else "messages"
    question = [{"role": "user", "content": CAPITAL_PROMPT}]
    expected = _chat(gw, messages=question, max_tokens=24)
    text, usage = expected["choices"][0]["message"]["content"], expected["usage"]
    before = _requests(gw, endpoint)

    whole = litellm.completion(messages=question, max_tokens=24, **kw)
    assert _tier(whole) == "edge"
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == "stop"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (usage["prompt_tokens"],
                                                                          usage["completion_tokens"])

    chunks = list(litellm.completion(messages=question, max_tokens=24, stream=True,
                                     stream_options={"include_usage": True}, **kw))
    assert _text_of(chunks) == text
    built = litellm.stream_chunk_builder(chunks, messages=question)
    assert (built.usage.prompt_tokens, built.usage.completion_tokens) == (usage["prompt_tokens"],
                                                                          usage["completion_tokens"])

    async def in_async() -> tuple[Any, str]:
        answer = await litellm.acompletion(messages=question, max_tokens=24, **kw)
        stream = await litellm.acompletion(messages=question, max_tokens=24, stream=True, **kw)
        return answer, _text_of([c async for c in stream])

    answer, streamed_text = asyncio.run(in_async())
    assert answer.choices[0].message.content == streamed_text == text
    assert _requests(gw, endpoint) >= before + 4


@pytest.mark.parametrize("route", ["openai", "anthropic"])
def test_litellm_tool_round_trip(gw: ThreadedGateway, route: str) -> None:
    """A required tool call, whole and streamed, with the arguments the chat request by hand gets; then the follow-up
    turn with the tool's result and the tool still offered (`auto`), answered in text."""
    kw = ({**OPENAI_ROUTE, "api_base": gw.url + "/v1"} if route == "openai"
          else {**ANTHROPIC_ROUTE, "api_base": gw.url})
    ask = [{"role": "user", "content": WEATHER_PROMPT}]
    reference = _chat(gw, messages=ask, tools=[WEATHER_TOOL], tool_choice="required",
                      max_tokens=48)["choices"][0]["message"]["tool_calls"][0]["function"]

    called = litellm.completion(messages=ask, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=48, **kw)
    assert _tier(called) == "edge" and called.choices[0].finish_reason == "tool_calls"
    (call,) = called.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == json.loads(reference["arguments"])

    chunks = list(litellm.completion(messages=ask, tools=[WEATHER_TOOL], tool_choice="required", max_tokens=48,
                                     stream=True, **kw))
    (streamed,) = litellm.stream_chunk_builder(chunks).choices[0].message.tool_calls
    assert streamed.function.name == "get_weather"
    assert json.loads(streamed.function.arguments) == json.loads(reference["arguments"])

    args = json.loads(call.function.arguments)
    result = get_weather.invoke(args)
    follow = [*ask, *_tool_turn(call.id, args, result)]
    expected = _chat(gw, messages=follow, tools=[WEATHER_TOOL], max_tokens=32)["choices"][0]["message"]["content"]
    answer = litellm.completion(messages=follow, tools=[WEATHER_TOOL], max_tokens=32, **kw)
    assert not answer.choices[0].message.tool_calls
    assert answer.choices[0].message.content == expected
