"""The surfaces over the chat pipeline, end to end through a real gateway (uvicorn) in front of a backend that gives
fixed answers (`tests.support.fixed_backend`): what a backend's chat answer, stream, error frame or malformed tool
call becomes in Anthropic's and the Responses API's shapes, and that errors of the pipeline (auth, body, model,
limits) come in the surface's format. Real-model runs: tests/integration/test_api_surfaces.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from aiohttp import web

from tests.gateway.conftest import KEYS, write_policy
from tests.support.edge import parse_metrics
from tests.support.fixed_backend import fixed_backend
from tests.support.servers import ThreadedGateway, aiohttp_server, gateway_server
from tiergate.gateway.settings import Settings

AUTH = {"authorization": "Bearer key-alpha-1"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TOOL_ANSWER = {"id": "c1", "object": "chat.completion", "model": "edge-model", "choices": [
    {"index": 0, "finish_reason": "tool_calls",
     "message": {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]}}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def _frame(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return msgspec.json.encode({"id": "c1", "object": "chat.completion.chunk", "model": "edge-model",
                                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


FRAMES = [
    _frame({"role": "assistant", "content": ""}),
    _frame({"content": "Let "}), _frame({"content": "me look."}),
    _frame({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _frame({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _frame({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _frame({}, "tool_calls"),
    msgspec.json.encode({"id": "c1", "object": "chat.completion.chunk", "model": "edge-model", "choices": [],
                         "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}),
]
MESSAGES = {"model": "auto", "max_tokens": 32, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
RESPONSES = {"model": "auto", "input": "Weather in Paris?",
             "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]}


@contextmanager
def _gateway(tmp_path: Path, backend: web.Application, **settings: Any) -> Iterator[ThreadedGateway]:
    with aiohttp_server(backend) as edge:
        policy = write_policy(tmp_path / "policy.yaml", [edge.url], ["http://127.0.0.1:9"], fallback=False,
                              cache=False)
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None, **settings), keyring=KEYS) as gw:
            yield gw


@pytest.fixture(scope="module")
def tool_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedGateway]:
    with _gateway(tmp_path_factory.mktemp("surface"), fixed_backend(msgspec.json.encode(TOOL_ANSWER), FRAMES),
                  max_body_bytes=4096) as gw:
        yield gw


def _events(r: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of every SSE event, checking each is well formed."""
    out = []
    for block in r.text.split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
    return out


def test_messages_json_answer_with_a_tool_call(tool_gw: ThreadedGateway) -> None:
    r = httpx.post(tool_gw.url + "/v1/messages", headers={"x-api-key": "key-alpha-1",
                                                          "anthropic-version": "2023-06-01"}, json=MESSAGES)
    assert r.status_code == 200, r.text
    assert r.headers["x-tiergate-tier"] == "edge" and r.headers["x-request-id"]
    body = r.json()
    assert body["type"] == "message" and body["role"] == "assistant" and body["id"].startswith("msg_")
    assert body["content"] == [{"type": "text", "text": "Let me look."},
                               {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]
    assert body["stop_reason"] == "tool_use"
    assert body["usage"] == {"input_tokens": 11, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0,
                             "output_tokens": 7}
    assert int(r.headers["content-length"]) == len(r.content)


def test_messages_stream_is_anthropics_event_sequence(tool_gw: ThreadedGateway) -> None:
    r = httpx.post(tool_gw.url + "/v1/messages", headers=AUTH, json={**MESSAGES, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    # the gateway's count of the prompt at the start (the tier's own comes in message_delta)
    counted = int(r.headers["x-tiergate-prompt-tokens"])
    assert counted > 0 and events[0][1]["message"]["usage"]["input_tokens"] == counted
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0) \
        == "Let me look."
    assert events[5][1]["content_block"] == {"type": "tool_use", "name": "get_weather", "input": {}, "id": "call_1"}
    partial = "".join(d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1)
    assert json.loads(partial) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"input_tokens": 11, "cache_read_input_tokens": 0,
                                      "cache_creation_input_tokens": 0, "output_tokens": 7}


def test_responses_json_answer_with_a_tool_call(tool_gw: ThreadedGateway) -> None:
    r = httpx.post(tool_gw.url + "/v1/responses", headers=AUTH, json=RESPONSES)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["status"] == "completed" and body["store"] is False
    message, call = body["output"]
    assert message["type"] == "message" and message["content"][0]["text"] == "Let me look."
    assert call["type"] == "function_call" and call["call_id"] == "call_1" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert body["usage"]["input_tokens"] == 11 and body["usage"]["output_tokens"] == 7
    assert body["usage"]["total_tokens"] == 18


def test_responses_stream_is_the_responses_event_sequence(tool_gw: ThreadedGateway) -> None:
    r = httpx.post(tool_gw.url + "/v1/responses", headers=AUTH, json={**RESPONSES, "stream": True})
    events = _events(r)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and [o["type"] for o in final["output"]] == ["message", "function_call"]
    assert final["output"][0]["content"][0]["text"] == "Let me look."
    assert json.loads(final["output"][1]["arguments"]) == {"city": "Paris"}
    assert final["usage"]["output_tokens"] == 7


def test_surfaces_are_counted_under_their_own_endpoint_and_refusals_as_the_pipelines(tool_gw: ThreadedGateway
                                                                                    ) -> None:
    def count(name: str, **labels: str) -> float:
        samples = parse_metrics(httpx.get(tool_gw.url + "/metrics").text)
        return sum(v for (n, lab), v in samples.items() if n == name and set(labels.items()) <= set(lab))

    answered = {e: count("tiergate_requests_total", endpoint=e, tier="edge") for e in ("messages", "responses")}
    refused = count("tiergate_client_errors_total", code="invalid_api_key")
    assert httpx.post(tool_gw.url + "/v1/messages", headers=AUTH, json=MESSAGES).status_code == 200
    assert httpx.post(tool_gw.url + "/v1/responses", headers=AUTH, json=RESPONSES).status_code == 200
    assert httpx.post(tool_gw.url + "/v1/responses", headers={"authorization": "Bearer wrong"},
                      json=RESPONSES).status_code == 401
    assert count("tiergate_requests_total", endpoint="messages", tier="edge") == answered["messages"] + 1
    assert count("tiergate_requests_total", endpoint="responses", tier="edge") == answered["responses"] + 1
    assert count("tiergate_client_errors_total", code="invalid_api_key") == refused + 1


@pytest.mark.parametrize(("headers", "body", "status", "kind", "words"), [
    ({}, MESSAGES, 401, "authentication_error", "API key"),
    ({"x-api-key": "wrong"}, MESSAGES, 401, "authentication_error", "key"),
    (AUTH, b"{not json", 400, "invalid_request_error", "not valid JSON"),
    (AUTH, {**MESSAGES, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens"),
    (AUTH, {k: v for k, v in MESSAGES.items() if k != "max_tokens"}, 400, "invalid_request_error", "max_tokens"),
    (AUTH, {**MESSAGES, "temperature": 1.5}, 400, "invalid_request_error", "temperature"),
    (AUTH, {**MESSAGES, "model": "claude-nope"}, 404, "not_found_error", "claude-nope"),
    (AUTH, {**MESSAGES, "mcp_servers": []}, 400, "invalid_request_error", "mcp_servers"),
    (AUTH, {**MESSAGES, "messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}]}, 400, "invalid_request_error", "messages[0]"),
    (AUTH, {**MESSAGES, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
     "invalid_request_error", "tools[0]"),
    (AUTH, {**MESSAGES, "system": "x" * 5000}, 413, "request_too_large", "limit"),
])
def test_messages_errors_are_anthropic_errors(tool_gw: ThreadedGateway, headers: dict[str, str], body: Any,
                                              status: int, kind: str, words: str) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(tool_gw.url + "/v1/messages", headers={**headers, "content-type": "application/json"},
                   content=content)
    assert r.status_code == status, r.text
    assert r.json() == {"type": "error", "error": {"type": kind, "message": r.json()["error"]["message"]}}
    assert words in r.json()["error"]["message"]
    assert r.headers["x-request-id"]


@pytest.mark.parametrize(("change", "status", "param"), [
    ({"store": True}, 400, "store"),
    ({"previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"tool_choice": {"type": "web_search"}}, 400, "tool_choice"),
    ({"reasoning": {"effort": "high"}}, 400, "reasoning"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0]"),
    ({"text": {"format": {"type": "json_schema"}}}, 400, "text.format"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"model": "gpt-nope"}, 404, "model"),
])
def test_responses_errors_are_openai_errors(tool_gw: ThreadedGateway, change: dict[str, Any], status: int,
                                            param: str) -> None:
    r = httpx.post(tool_gw.url + "/v1/responses", headers=AUTH, json={**RESPONSES, **change})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param"} and err["param"] == param


def test_a_stream_broken_by_the_backend_ends_in_the_surfaces_error_event(tmp_path: Path) -> None:
    error = msgspec.json.encode({"error": {"message": "the model crashed", "type": "server_error"}})
    with _gateway(tmp_path, fixed_backend(b"{}", [FRAMES[1], error])) as gw:
        messages = _events(httpx.post(gw.url + "/v1/messages", headers=AUTH, json={**MESSAGES, "stream": True}))
        responses = _events(httpx.post(gw.url + "/v1/responses", headers=AUTH, json={**RESPONSES, "stream": True}))
    assert messages[-1] == ("error", {"type": "error", "error": {"type": "api_error",
                                                                 "message": "the model crashed"}})
    assert "message_stop" not in [n for n, _ in messages]
    assert responses[-1][0] == "error" and responses[-1][1]["message"] == "the model crashed"
    assert "response.completed" not in [n for n, _ in responses]


def test_tool_arguments_that_are_not_json_are_a_502_not_an_invented_input(tmp_path: Path) -> None:
    bad = {**TOOL_ANSWER, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{**CALL, "function": {"name": "f", "arguments": "{oops"}}]}}]}
    with _gateway(tmp_path, fixed_backend(msgspec.json.encode(bad))) as gw:
        r = httpx.post(gw.url + "/v1/messages", headers=AUTH, json=MESSAGES)
    assert r.status_code == 502
    assert r.json()["error"]["type"] == "api_error" and int(r.headers["content-length"]) == len(r.content)
