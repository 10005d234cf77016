"""OpenAI Responses → chat translation, one request field at a time, and a chat answer back (no server: the
translation is pure). The same through a gateway: tests/gateway/test_surface.py; with the openai SDK and a real
model: tests/integration/test_api_surfaces.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiergate.core.errors import OpenAIError
from tiergate.core.wire import decode_chat
from tiergate.gateway.responses_api import ResponsesSurface, to_chat


def _chat(**fields: Any) -> dict[str, Any]:
    chat, _ = to_chat(json.dumps({"model": "auto", **fields}).encode())
    decode_chat(json.dumps(chat).encode())  # whatever it writes is a valid chat request
    return chat


def test_a_string_input_with_instructions_and_sampling_fields() -> None:
    chat = _chat(input="Hi", instructions="Be brief.", max_output_tokens=20, temperature=0.2, top_p=0.5,
                 user="u-1", metadata={"k": "v"}, store=False, truncation="disabled", reasoning={"effort": None})
    assert chat == {"model": "auto", "max_tokens": 20, "temperature": 0.2, "top_p": 0.5, "user": "u-1",
                    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


def test_items_with_parallel_calls_and_their_outputs() -> None:
    chat = _chat(input=[
        {"role": "developer", "content": "Use tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Paris and Rome?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sunny and rain."}]}],
        tools=[{"type": "function", "name": "w", "description": "Weather.", "parameters": {"type": "object"},
                "strict": True}], tool_choice={"type": "function", "name": "w"}, parallel_tool_calls=False)
    assert chat["messages"] == [
        {"role": "developer", "content": "Use tools."}, {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "w", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": "Sunny and rain."}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "w", "description": "Weather.",
                                                              "parameters": {"type": "object"}, "strict": True}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(("fmt", "expected"), [
    ({"type": "text"}, None), ({"type": "json_object"}, {"type": "json_object"}),
    ({"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True},
     {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}})])
def test_text_format(fmt: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert _chat(input="x", text={"format": fmt}).get("response_format") == expected


@pytest.mark.parametrize(("fields", "param"), [
    ({"store": True}, "store"), ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"conversation": "conv_1"}, "conversation"), ({"background": True}, "background"),
    ({"tools": [{"type": "file_search"}]}, "tools[0].type"), ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"input": [{"type": "function_call", "name": "w"}]}, "input[0]"),
    ({"input": [{"type": "computer_call_output"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content"),
    ({"input": []}, "input"), ({"input": "x", "prompt": {"id": "p"}}, None),
])
def test_what_cannot_be_translated_is_a_400_naming_the_field(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(OpenAIError) as err:
        to_chat(json.dumps({"model": "auto", "input": "x", **fields}).encode())
    assert err.value.status == 400 and err.value.param == param


def test_the_answer_back() -> None:
    _, back = ResponsesSurface().translate(b'{"model": "auto", "input": "x", "max_output_tokens": 2}')
    body = json.loads(back.answer({"choices": [{"index": 0, "finish_reason": "length",
                                                "message": {"role": "assistant", "content": "He"}}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                             "prompt_tokens_details": {"cached_tokens": 1}}}))
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["content"][0] == {"type": "output_text", "text": "He", "annotations": [],
                                               "logprobs": []}
    assert body["usage"] == {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1}, "output_tokens": 2,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5}
    assert body["store"] is False and body["max_output_tokens"] == 2
