"""Real models end to end: SmolLM2-135M-Instruct served by `edge-node serve`, checked against llama.cpp itself.

The reference is llama-cpp-python's own high-level API on the same GGUF file and chat template, greedy, with the
same attention settings (flash attention, as the node's llama.cpp picks on this CPU): the node's answers and
log-probabilities must be exactly llama.cpp's, whatever the model knows. Structured output and tool calls are
parsed every time. Gemma 3 270M, which ships no chat template, gets llama.cpp's own `gemma` template.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.gateway.conftest import write_policy
from tests.support.edge import EdgeProcess, start_edge_node
from tests.support.servers import gateway_server
from tiergate.edge_node.model.packaged import packaged_path
from tiergate.gateway.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

README_PROMPT = "What is the capital of France? Answer with one word."
CTX = 2048


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return packaged_path("smollm2-135m-instruct")  # installed by scripts/setup.sh --dev; missing is a failure


@pytest.fixture(scope="module")
def node(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EdgeProcess]:
    with start_edge_node(smollm2, "--parallel", "2", "--ctx", str(CTX), "--model-name", "smollm2",
                         workdir=tmp_path_factory.mktemp("smollm2")) as n:
        yield n


@pytest.fixture(scope="module")
def reference(smollm2: Path):
    """llama.cpp's own answers for the same file (llama-cpp-python's high-level API)."""
    import llama_cpp  # optional dependency: the edge extra, installed with the test set-up

    return llama_cpp.Llama(str(smollm2), n_ctx=CTX, n_threads=1, n_threads_batch=1, logits_all=True,
                           flash_attn=True, verbose=False)


def _chat(node: EdgeProcess, **body) -> dict:
    r = httpx.post(node.url + "/v1/chat/completions", json={"model": "smollm2", "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _events(node: EdgeProcess, path: str, **body) -> list[dict]:
    with httpx.stream("POST", node.url + path, timeout=120,
                      json={"model": "smollm2", "temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200
        lines = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_the_readme_example_through_the_gateway_is_llama_cpps_own_greedy_answer(node, reference, tmp_path):
    policy = write_policy(tmp_path / "policy.yaml", [node.url], ["http://127.0.0.1:9"], fallback=False, cache=False)
    messages = [{"role": "user", "content": README_PROMPT}]
    expected = reference.create_chat_completion(messages, temperature=0, max_tokens=32)["choices"][0]["message"]
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
        client = OpenAI(base_url=gw.url + "/v1", api_key="tg-demo-key")
        reply = client.chat.completions.create(model="auto", messages=messages, max_tokens=32, temperature=0)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="auto", messages=messages, max_tokens=32, temperature=0, stream=True) if c.choices)
    assert reply.choices[0].message.content == expected["content"] == streamed
    assert "Paris" in expected["content"]  # what the README shows


def _same(a: float, b: float) -> bool:
    return abs(float(a) - float(b)) <= 1e-5


def test_chat_logprobs_are_llama_cpps_values(node, reference):
    messages = [{"role": "user", "content": "Name a primary colour."}]
    ref = reference.create_chat_completion(messages, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    got = _chat(node, messages=messages, max_tokens=12, logprobs=True, top_logprobs=3)
    ref_tokens, got_tokens = ref["choices"][0]["logprobs"]["content"], got["choices"][0]["logprobs"]["content"]
    assert got["choices"][0]["message"]["content"] == ref["choices"][0]["message"]["content"]
    assert [t["token"] for t in got_tokens] == [t["token"] for t in ref_tokens]
    for r, g in zip(ref_tokens, got_tokens, strict=True):
        assert _same(r["logprob"], g["logprob"]) and bytes(g["bytes"]).decode() == g["token"]
        assert [t["token"] for t in g["top_logprobs"]] == [t["token"] for t in r["top_logprobs"]]
        assert all(_same(a["logprob"], b["logprob"]) for a, b in zip(r["top_logprobs"], g["top_logprobs"], strict=True))


def test_text_logprobs_are_llama_cpps_values_whole_and_streamed(node, reference):
    prompt = "The three largest planets are"
    ref = reference.create_completion(prompt, temperature=0, max_tokens=10, logprobs=2)["choices"][0]["logprobs"]
    whole = httpx.post(node.url + "/v1/completions", timeout=120, json={
        "model": "smollm2", "prompt": prompt, "temperature": 0, "max_tokens": 10, "logprobs": 2}).json()
    got = whole["choices"][0]["logprobs"]
    assert got["tokens"] == ref["tokens"] and got["text_offset"] == ref["text_offset"]
    assert all(_same(a, b) for a, b in zip(ref["token_logprobs"], got["token_logprobs"], strict=True))
    for r, g in zip(ref["top_logprobs"], got["top_logprobs"], strict=True):
        assert r.keys() == g.keys() and all(_same(r[k], g[k]) for k in r)
    chunks = [c["choices"][0] for c in _events(node, "/v1/completions", prompt=prompt, max_tokens=10, logprobs=2)
              if c["choices"]]
    streamed = [tok for c in chunks if c["logprobs"] for tok in c["logprobs"]["tokens"]]
    streamed_lp = [lp for c in chunks if c["logprobs"] for lp in c["logprobs"]["token_logprobs"]]
    assert streamed == ref["tokens"] and all(_same(a, b) for a, b in zip(ref["token_logprobs"], streamed_lp,
                                                                          strict=True))


def test_streamed_chat_logprobs_cover_every_token_of_the_answer(node, reference):
    messages = [{"role": "user", "content": "Write three words about the sea."}]
    ref = reference.create_chat_completion(messages, temperature=0, max_tokens=16, logprobs=True, top_logprobs=1)
    events = _events(node, "/v1/chat/completions", messages=messages, max_tokens=16, logprobs=True, top_logprobs=1)
    entries = [t for e in events for c in e["choices"] if c.get("logprobs") for t in c["logprobs"]["content"]]
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == ref["choices"][0]["message"]["content"] == "".join(t["token"] for t in entries)
    assert all(_same(r["logprob"], g["logprob"])
               for r, g in zip(ref["choices"][0]["logprobs"]["content"], entries, strict=True))


CITY = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"},
                                         "coastal": {"type": "boolean"}},
        "required": ["city", "population", "coastal"], "additionalProperties": False}


@pytest.mark.parametrize("prompt", ["Describe Paris.", "Tell me about a large city in Japan.", "Lisbon?"])
def test_json_schema_answers_always_parse_and_validate(node, prompt):
    answer = _chat(node, messages=[{"role": "user", "content": prompt}], max_tokens=96,
                   response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), CITY)


def test_json_object_mode_streams_one_json_object(node):
    events = _events(node, "/v1/chat/completions", max_tokens=200, response_format={"type": "json_object"},
                     messages=[{"role": "user", "content": "A JSON object with a name and an age, nothing else."}])
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    finish = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict)
    else:  # cut at max_tokens: still a prefix of one JSON object
        assert finish == ["length"] and text.lstrip().startswith("{")


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Local time in a timezone",
                                         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                                        "required": ["tz"]}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_tool_calls_come_in_openai_shape_whole_and_streamed(node, choice):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = _chat(node, messages=messages, max_tokens=64, tools=[WEATHER, TIME], tool_choice=choice)["choices"][0]
    assert answer["finish_reason"] == "tool_calls" and answer["message"]["content"] is None
    (call,) = answer["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] in {"get_weather", "get_time"}
    args = json.loads(call["function"]["arguments"])
    schema = (WEATHER if call["function"]["name"] == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(args, schema)
    if isinstance(choice, dict):
        assert call["function"]["name"] == "get_weather"
    events = _events(node, "/v1/chat/completions", messages=messages, max_tokens=64, tools=[WEATHER],
                     tool_choice=choice if isinstance(choice, dict) else "required")
    deltas = [c["delta"] for e in events for c in e["choices"] if c["delta"].get("tool_calls")]
    assert len(deltas) == 1 and events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(deltas[0]["tool_calls"][0]["function"]["arguments"]),
                        WEATHER["function"]["parameters"])


def _check_call_or_text(message, finish: str | None, schemas: dict[str, dict]) -> str:
    """An `auto` answer is text, or calls whose arguments validate against their tool's schema."""
    if message.tool_calls:
        assert message.content is None and finish == "tool_calls"
        for call in message.tool_calls:
            assert call.id.startswith("call_") and call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        return "call"
    assert message.content and finish in ("stop", "length")
    return "text"


def test_tools_without_tool_choice_are_answered_in_text_or_with_a_valid_call(node):
    # `auto` is what LangChain's bind_tools, agent loops after a tool result, instructor's PARALLEL_TOOLS and
    # `llm -T` send: no tool_choice with tools.
    client = OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    turns = [[{"role": "user", "content": "What is the weather in Paris?"}],
             [{"role": "user", "content": "Write one sentence about the sea."}],
             [{"role": "user", "content": "What is the weather in Paris?"},  # an agent's second turn
              {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                  "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 degrees."}]]
    kinds = set()
    for messages in turns:
        reply = client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER, TIME],
                                               max_tokens=64, temperature=0)
        kind = _check_call_or_text(reply.choices[0].message, reply.choices[0].finish_reason, schemas)
        chunks = list(client.chat.completions.create(model="smollm2", messages=messages, tools=[WEATHER, TIME],
                                                     max_tokens=64, temperature=0, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        [finish] = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        # Not compared with the whole answer: a prompt prefilled afresh or read from the prefix cache can round
        # differently, and a greedy answer may then part ways (it does for the first prompt).
        if calls:
            assert not text and finish == "tool_calls"
            for call in calls:
                jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        else:
            assert text and finish in ("stop", "length")
        kinds.add(kind)
    assert "text" in kinds  # asked to write a sentence, it writes one


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str


class GetWeather(BaseModel):
    """Current weather of a place."""

    place: Place
    unit: Unit


@pytest.mark.parametrize("choice", ["required", None], ids=["required", "auto"])
def test_a_pydantic_tool_with_defs_gets_arguments_that_validate(node, choice):
    tool = openai.pydantic_function_tool(GetWeather)
    assert "$defs" in tool["function"]["parameters"]  # pydantic's enum and nested model, by reference
    client = OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0)
    extra = {"tool_choice": choice} if choice else {}
    reply = client.chat.completions.create(model="smollm2", max_tokens=96, temperature=0, tools=[tool], **extra,
                                           messages=[{"role": "user", "content": "Weather in Paris, France?"}])
    kind = _check_call_or_text(reply.choices[0].message, reply.choices[0].finish_reason,
                               {"GetWeather": tool["function"]["parameters"]})
    if choice == "required":
        assert kind == "call"
    for call in reply.choices[0].message.tool_calls or []:
        got = GetWeather.model_validate_json(call.function.arguments)
        assert isinstance(got.unit, Unit) and got.place.city


def test_tools_without_tool_choice_stay_on_the_edge_through_the_gateway(node, tmp_path):
    # Before, the edge refused `auto` and the gateway escalated every agent turn to the expensive tier (here a
    # cloud that is down, so an escalation would fail).
    policy = write_policy(tmp_path / "policy.yaml", [node.url], ["http://127.0.0.1:9"], cache=False)
    with gateway_server(Settings(policy=policy, embedder=None, redis_url=None)) as gw:
        client = OpenAI(base_url=gw.url + "/v1", api_key="tg-demo-key", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="auto", max_tokens=64, temperature=0, tools=[WEATHER, openai.pydantic_function_tool(GetWeather)],
            messages=[{"role": "user", "content": "What is the weather in Paris?"}])
        reply = raw.parse()
    assert raw.headers["x-tiergate-tier"] == "edge" and "x-tiergate-fallback-from" not in raw.headers
    _check_call_or_text(reply.choices[0].message, reply.choices[0].finish_reason,
                        {"get_weather": WEATHER["function"]["parameters"],
                         "GetWeather": openai.pydantic_function_tool(GetWeather)["function"]["parameters"]})


CITY_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


def _calls(node: EdgeProcess, stream: bool, **body) -> list[dict]:
    """The tool calls of one answer, whole or streamed (their deltas come whole, see Answer.tool_call_chunk)."""
    if not stream:
        return _chat(node, **body)["choices"][0]["message"]["tool_calls"]
    return [tc for e in _events(node, "/v1/chat/completions", **body) for c in e["choices"]
            for tc in c["delta"].get("tool_calls") or []]


def test_required_tool_calls_are_one_or_more_unless_parallel_calls_are_off(smollm2, tmp_path):
    """`required` with parallel calls (the default) may answer with a JSON array of calls; with them off, one call.

    Left alone, SmolLM2 answers this prompt with one object, so the answer's first token is pushed to `[` by a logit
    bias: the grammar then decides whether `[` may start it. The tool's one argument is an enum, so the bias cannot leak into it."""
    import llama_cpp  # the edge extra, installed with the test set-up

    vocab = llama_cpp.Llama(str(smollm2), vocab_only=True, verbose=False)
    [bracket] = vocab.tokenize(b"[", add_bos=False, special=False)
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris and in Rome?"}], "tools": [CITY_TOOL],
            "tool_choice": "required", "max_tokens": 96, "logit_bias": {str(bracket): 100}}
    # A fresh node: a greedy answer can differ with what the prefix cache holds, so each run starts from the same.
    with start_edge_node(smollm2, "--parallel", "2", "--ctx", str(CTX), "--model-name", "smollm2",
                         workdir=tmp_path) as fresh:
        several = [_calls(fresh, stream, **body) for stream in (True, False)]
        one = [_calls(fresh, stream, **body, parallel_tool_calls=False) for stream in (True, False)]
    for calls in several + one:
        assert calls and all(c["function"]["name"] == "get_weather" for c in calls)
        for call in calls:
            jsonschema.validate(json.loads(call["function"]["arguments"]), CITY_TOOL["function"]["parameters"])
    cities = [[json.loads(c["function"]["arguments"])["city"] for c in calls] for calls in several]
    assert ["Paris", "Rome"] in cities, cities  # both cities asked about, in one answer of two calls
    assert [len(calls) for calls in one] == [1, 1]  # `[` is not allowed to start it: one object


@pytest.mark.parametrize("body, param", [
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"tools": [{"type": "function", "function": {"name": "has spaces"}}], "tool_choice": "required"},
     "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
])
def test_bad_logprobs_schemas_and_tools_are_400s_naming_the_field(node, body, param):
    r = httpx.post(node.url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert node.health()["status"] == "ok"  # and nothing was left behind


def test_gemma_without_a_chat_template_gets_llama_cpps_gemma_template(tmp_path):
    gemma = packaged_path("gemma-3-270m")
    with start_edge_node(gemma, "--parallel", "1", "--ctx", "1024", workdir=tmp_path) as g:
        answer = httpx.post(g.url + "/v1/chat/completions", timeout=120, json={
            "model": "gemma", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
            "temperature": 0}).json()
        assert answer["choices"][0]["finish_reason"] in ("stop", "length")
        # <start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n: llama.cpp's template for gemma
        assert answer["usage"]["prompt_tokens"] == 10
        loaded = next(json.loads(line) for line in g.log().splitlines() if '"model loaded"' in line)
    assert loaded["chat_template"] == "llama.cpp:gemma"
