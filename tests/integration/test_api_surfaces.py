"""Anthropic Messages and OpenAI Responses through the gateway, driven by the official `anthropic` and `openai`
SDKs, against a real SmolLM2-135M-Instruct edge node (`edge-node serve`) and a real Redis for the cache.

Each surface's answer is checked against the chat answer the same gateway gives for the same request (greedy, so
the same pipeline must give the same text), streaming and not, with a tool call round trip; and the requests are
shown to go through the chat pipeline: routed to the edge tier by the policy's rule, cached, counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.gateway.conftest import write_policy
from tests.support.edge import EdgeProcess, parse_metrics, smollm2_node
from tests.support.redis import RedisServer, flushed
from tests.support.servers import ThreadedGateway, gateway_server
from tests.support.waiting import wait_until
from tiergate.complexity.tokens import TokenCounter
from tiergate.core.wire import decode_chat
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

KEY = "tg-demo-key"
PROMPT = "What is the capital of France? Answer with one word."
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL_PROMPT = "What is the weather in Paris? Use the tool."
TOOL_RESULT = "Sunny, 24 degrees Celsius."
T0 = {"temperature": 0}  # the anthropic SDK 2.x has no `temperature` argument; the API takes the field


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with smollm2_node(tmp_path_factory.mktemp("smollm2")) as n:
        yield n


@pytest.fixture(scope="module")
def gw(node: EdgeProcess, redis7_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[ThreadedGateway]:
    policy = write_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", [node.url], ["http://127.0.0.1:9"],
                          fallback=False, cache=True)
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=flushed(redis7_server))) as g:
        yield g


def _anthropic(gw: ThreadedGateway, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0, timeout=120)


def _openai(gw: ThreadedGateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _chat(gw: ThreadedGateway, **body: Any) -> dict[str, Any]:
    """The chat answer the same gateway gives for the same request: the reference (greedy, so fresh or cached, the
    same answer)."""
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=120,
                   json={"model": "auto", "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def _metric(gw: ThreadedGateway, name: str, **labels: str) -> float:
    samples = parse_metrics(httpx.get(gw.url + "/metrics").text)
    return sum(v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab))


WEATHER_TOOL_ANTHROPIC = {"name": "get_weather", "description": "Current weather in a city.",
                          "input_schema": WEATHER_SCHEMA}
WEATHER_TOOL_RESPONSES = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                          "parameters": WEATHER_SCHEMA}
WEATHER_TOOL_CHAT = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                                      "parameters": WEATHER_SCHEMA}}


# ---- Anthropic Messages -------------------------------------------------------------------------------------------

def test_messages_answer_is_the_chat_answer_streamed_or_not(gw: ThreadedGateway) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    chat = _chat(gw, messages=[{"role": "system", "content": "Be brief."}, *messages], max_tokens=24)
    client = _anthropic(gw)
    raw = client.messages.with_raw_response.create(model="auto", system="Be brief.", messages=messages,
                                                   max_tokens=24, extra_body=T0)
    msg = raw.parse()
    # Routed by the policy's rule; the chat request just before may have filled the cache with this very answer.
    assert raw.headers["x-tiergate-rule"] == "default" and raw.headers["x-tiergate-tier"] in ("edge", "cache")
    assert msg.type == "message" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == chat["choices"][0]["message"]["content"]
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == chat["usage"]["prompt_tokens"]
    assert msg.usage.output_tokens == chat["usage"]["completion_tokens"]
    assert msg.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat["choices"][0]["finish_reason"]]

    with client.messages.stream(model="auto", system="Be brief.", messages=messages,
                                max_tokens=24, extra_body=T0) as stream:
        seen = list(stream)
        final = stream.get_final_message()
    events = [e.type for e in seen]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert seen[0].message.usage.input_tokens > 0  # the gateway's count, before the tier's comes in message_delta
    assert "content_block_delta" in events and "message_delta" in events
    assert final.content[0].text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason
    assert final.usage.output_tokens == msg.usage.output_tokens


def test_messages_tool_round_trip_streamed_and_not(gw: ThreadedGateway) -> None:
    client = _anthropic(gw)
    ask = [{"role": "user", "content": TOOL_PROMPT}]
    chat = _chat(gw, messages=ask, tools=[WEATHER_TOOL_CHAT], tool_choice="required", max_tokens=48)
    chat_call = chat["choices"][0]["message"]["tool_calls"][0]["function"]
    msg = client.messages.create(model="auto", messages=ask, tools=[WEATHER_TOOL_ANTHROPIC],
                                 tool_choice={"type": "any"}, max_tokens=48, extra_body=T0)
    assert msg.stop_reason == "tool_use"
    use = next(b for b in msg.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == json.loads(chat_call["arguments"])
    jsonschema.validate(use.input, WEATHER_SCHEMA)

    with client.messages.stream(model="auto", messages=ask, tools=[WEATHER_TOOL_ANTHROPIC],
                                tool_choice={"type": "any"}, max_tokens=48, extra_body=T0) as stream:
        kinds = {(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream}
        streamed = stream.get_final_message()
    assert ("content_block_delta", "input_json_delta") in kinds
    streamed_use = next(b for b in streamed.content if b.type == "tool_use")
    assert streamed.stop_reason == "tool_use" and streamed_use.input == use.input

    # The second turn: the call and its result go back; with tool_choice none the answer is text, and it is the
    # chat answer to the same conversation.
    follow = [*ask, {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": TOOL_RESULT}]}]
    chat2 = _chat(gw, max_tokens=32, tools=[WEATHER_TOOL_CHAT], tool_choice="none", messages=[
        *ask, {"role": "assistant", "content": None, "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": chat_call["arguments"]}}]},
        {"role": "tool", "tool_call_id": use.id, "content": TOOL_RESULT}])
    reply = client.messages.create(model="auto", messages=follow, tools=[WEATHER_TOOL_ANTHROPIC],
                                   tool_choice={"type": "none"}, max_tokens=32, extra_body=T0)
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == chat2["choices"][0]["message"]["content"]


def test_the_surfaces_share_the_pipelines_cache_and_metrics(gw: ThreadedGateway) -> None:
    """One question asked through chat, then Messages, then Responses: one cache entry answers all three."""
    question = [{"role": "user", "content": "Name one primary colour."}]
    before = _metric(gw, "tiergate_requests_total", endpoint="messages", tier="cache")
    first = httpx.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, timeout=120,
                       json={"model": "auto", "temperature": 0, "max_tokens": 16, "messages": question})
    assert first.headers["x-tiergate-cache"] == "miss"
    text = first.json()["choices"][0]["message"]["content"]
    client = _anthropic(gw)
    seen: list[Any] = []

    def messages_hit() -> bool:  # the answer is stored after it went out: ask until the cache has it
        r = client.messages.with_raw_response.create(model="auto", max_tokens=16, messages=question,
                                                     extra_body=T0)
        seen.append(r)
        return r.headers["x-tiergate-cache"] == "hit-exact"

    wait_until(messages_hit, timeout_s=30, what="the chat answer served to a Messages request from the cache")
    assert seen[-1].parse().content[0].text == text and seen[-1].headers["x-tiergate-tier"] == "cache"
    with client.messages.stream(model="auto", max_tokens=16, messages=question, extra_body=T0) as stream:
        assert stream.get_final_message().content[0].text == text
        assert stream.response.headers["x-tiergate-cache"] == "hit-exact"
    resp = _openai(gw).responses.with_raw_response.create(model="auto", input=question, max_output_tokens=16,
                                                          temperature=0)
    assert resp.headers["x-tiergate-cache"] == "hit-exact" and resp.parse().output_text == text
    assert _metric(gw, "tiergate_requests_total", endpoint="messages", tier="cache") >= before + 1
    assert _metric(gw, "tiergate_requests_total", endpoint="responses", tier="cache") >= 1


def test_messages_errors_are_anthropic_errors(gw: ThreadedGateway) -> None:
    with pytest.raises(anthropic.AuthenticationError) as auth:
        _anthropic(gw, key="wrong").messages.create(model="auto", max_tokens=8,
                                                    messages=[{"role": "user", "content": "hi"}])
    assert auth.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        _anthropic(gw).messages.create(model="no-such-model", max_tokens=8,
                                       messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError, match="web_search"):
        _anthropic(gw).messages.create(model="auto", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                       tools=[{"type": "web_search_20250305", "name": "web_search"}])
    r = httpx.post(gw.url + "/v1/messages", headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"},
                   json={"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_messages_count_tokens_is_the_policys_count(gw: ThreadedGateway) -> None:
    """The count the routing policy checks limits and context against: its tokenizer (here, with none configured,
    the built-in one) over the translated messages plus the template overhead, close to what the tier counts."""
    client = _anthropic(gw)
    messages = [{"role": "user", "content": PROMPT}]
    chat_messages = [{"role": "system", "content": "Be brief."}, *messages]
    counted = client.messages.count_tokens(model="auto", messages=messages, system="Be brief.")
    policy_count = TokenCounter("builtin:default").count(decode_chat(json.dumps(
        {"model": "auto", "messages": chat_messages}).encode()))
    assert counted.input_tokens == policy_count
    tier_count = _chat(gw, messages=chat_messages, max_tokens=1)["usage"]["prompt_tokens"]
    assert abs(counted.input_tokens - tier_count) <= max(4, tier_count // 4)
    longer = client.messages.count_tokens(model="auto", messages=[{"role": "user", "content": PROMPT * 3}])
    assert longer.input_tokens > counted.input_tokens
    with pytest.raises(anthropic.AuthenticationError):
        _anthropic(gw, key="wrong").messages.count_tokens(model="auto", messages=messages)


# ---- OpenAI Responses ---------------------------------------------------------------------------------------------

def test_responses_answer_is_the_chat_answer_streamed_or_not(gw: ThreadedGateway) -> None:
    chat = _chat(gw, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}],
                 max_tokens=24)
    client = _openai(gw)
    raw = client.responses.with_raw_response.create(model="auto", instructions="Be brief.", input=PROMPT,
                                                    max_output_tokens=24, temperature=0)
    resp = raw.parse()
    assert raw.headers["x-tiergate-rule"] == "default" and raw.headers["x-tiergate-tier"] in ("edge", "cache")
    assert resp.output_text == chat["choices"][0]["message"]["content"]
    assert resp.usage is not None and resp.usage.input_tokens == chat["usage"]["prompt_tokens"]
    assert resp.status == ("completed" if chat["choices"][0]["finish_reason"] == "stop" else "incomplete")
    assert resp.store is False

    events = list(client.responses.create(model="auto", instructions="Be brief.", input=PROMPT,
                                          max_output_tokens=24, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == f"response.{resp.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == resp.output_text == events[-1].response.output_text


def test_responses_tool_round_trip_streamed_and_not(gw: ThreadedGateway) -> None:
    client = _openai(gw)
    chat = _chat(gw, messages=[{"role": "user", "content": TOOL_PROMPT}], tools=[WEATHER_TOOL_CHAT],
                 tool_choice="required", max_tokens=48)
    chat_args = chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    resp = client.responses.create(model="auto", input=TOOL_PROMPT, tools=[WEATHER_TOOL_RESPONSES],
                                   tool_choice="required", max_output_tokens=48, temperature=0)
    call = next(o for o in resp.output if o.type == "function_call")
    assert call.name == "get_weather" and json.loads(call.arguments) == json.loads(chat_args)

    events = list(client.responses.create(model="auto", input=TOOL_PROMPT, tools=[WEATHER_TOOL_RESPONSES],
                                          tool_choice="required", max_output_tokens=48, temperature=0, stream=True))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(args) == json.loads(done.arguments) == json.loads(call.arguments)

    chat2 = _chat(gw, max_tokens=32, tools=[WEATHER_TOOL_CHAT], tool_choice="none", messages=[
        {"role": "user", "content": TOOL_PROMPT},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": TOOL_RESULT}])
    reply = client.responses.create(
        model="auto", tools=[WEATHER_TOOL_RESPONSES], tool_choice="none", max_output_tokens=32, temperature=0,
        input=[{"role": "user", "content": TOOL_PROMPT}, call.model_dump(),
               {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}])
    assert reply.output_text == chat2["choices"][0]["message"]["content"]
    assert all(o.type == "message" for o in reply.output)


def test_responses_structured_output_follows_the_schema(gw: ThreadedGateway) -> None:
    schema = {"type": "object", "properties": {"capital": {"type": "string"}}, "required": ["capital"],
              "additionalProperties": False}
    resp = _openai(gw).responses.create(
        model="auto", input=PROMPT, max_output_tokens=48, temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}})
    jsonschema.validate(json.loads(resp.output_text), schema)


def test_responses_refuse_what_a_stateless_gateway_cannot_do(gw: ThreadedGateway) -> None:
    client = _openai(gw)
    for extra, word in (({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
                        ({"tools": [{"type": "web_search"}]}, "web_search")):
        with pytest.raises(openai.BadRequestError, match=word) as err:
            client.responses.create(model="auto", input="hi", max_output_tokens=8, **extra)
        assert err.value.status_code == 400
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.url + "/v1", api_key="wrong", max_retries=0).responses.create(model="auto", input="hi")


def test_surfaces_over_the_readme_policy_path_exist_in_openapi(gw: ThreadedGateway) -> None:
    paths = httpx.get(gw.url + "/openapi.json").json()["paths"]
    assert {"/v1/messages", "/v1/messages/count_tokens", "/v1/responses"} <= set(paths)
