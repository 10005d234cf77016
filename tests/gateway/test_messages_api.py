"""Anthropic Messages → chat translation, one request field at a time, and a chat answer back (no server: the
translation is pure). The same through a gateway: tests/gateway/test_surface.py; with the anthropic SDK and a real
model: tests/integration/test_api_surfaces.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tiergate.core.errors import OpenAIError
from tiergate.core.wire import decode_chat
from tiergate.gateway.messages_api import MessagesSurface, anthropic_error, to_chat

BASE: dict[str, Any] = {"model": "auto", "max_tokens": 16}


def _chat(**fields: Any) -> dict[str, Any]:
    chat, _ = to_chat(json.dumps({**BASE, **fields}).encode())
    decode_chat(json.dumps(chat).encode())  # whatever it writes is a valid chat request
    return chat


def test_system_text_blocks_and_sampling_fields() -> None:
    chat = _chat(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
                 messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                 stop_sequences=["\n\n"], temperature=0.5, top_p=0.9, top_k=40, metadata={"user_id": "u-1"},
                 thinking={"type": "enabled", "budget_tokens": 1024}, cache_control={"type": "ephemeral"})
    assert chat == {"model": "auto", "max_tokens": 16, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
                    "stop": ["\n\n"], "user": "u-1", "messages": [
                        {"role": "system", "content": "Be brief.\nBe kind."}, {"role": "user", "content": "a\nb"}]}


def test_a_tool_round_trip_becomes_calls_then_tool_messages_then_the_users_text() -> None:
    chat = _chat(messages=[
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "two calls", "signature": "s"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "t2", "name": "w", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "sunny"},
            {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": "rain"}],
             "is_error": True},
            {"type": "text", "text": "And tomorrow?"}]}],
        tools=[{"name": "w", "description": "Weather.", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "w", "arguments": '{"city":"Paris"}'}},
            {"id": "t2", "type": "function", "function": {"name": "w", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: rain"},
        {"role": "user", "content": "And tomorrow?"}]
    assert chat["tools"] == [{"type": "function", "function": {"name": "w", "description": "Weather.",
                                                              "parameters": {"type": "object"}}}]
    assert chat["tool_choice"] == "auto" and chat["parallel_tool_calls"] is False


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "w"}, {"type": "function", "function": {"name": "w"}})])
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    chat = _chat(messages=[{"role": "user", "content": "x"}], tool_choice=choice,
                 tools=[{"name": "w", "input_schema": {"type": "object"}}])
    assert chat["tool_choice"] == expected and "parallel_tool_calls" not in chat


def test_images_become_image_parts_and_structured_output_a_json_schema() -> None:
    chat = _chat(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        {"type": "text", "text": "What is it?"}]}],
        output_config={"format": {"type": "json_schema", "schema": {"type": "object"}}})
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "What is it?"}]
    assert chat["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "output", "schema": {"type": "object"}}}


def test_a_stream_asks_the_pipeline_for_usage() -> None:
    chat = _chat(messages=[{"role": "user", "content": "x"}], stream=True)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(("fields", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}]}]},
     "messages[0].content[0].type"),  # a user cannot send a tool call
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "top_k": -1}, "top_k"),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"messages": [{"role": "user", "content": "x"}], "container": "c"}, None),
])
def test_what_cannot_be_translated_is_a_400_naming_the_field(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(OpenAIError) as err:
        to_chat(json.dumps({**BASE, **fields}).encode())
    assert err.value.status == 400 and err.value.param == param
    if param is None:
        assert "container" in err.value.message


def test_the_answer_back() -> None:
    _, back = MessagesSurface().translate(json.dumps({**BASE, "model": "tiergate-edge",
                                                      "messages": [{"role": "user", "content": "x"}]}).encode())
    body = json.loads(back.answer({"choices": [{"index": 0, "finish_reason": "length",
                                                "message": {"role": "assistant", "content": "Hel"}}],
                                   "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                             "prompt_tokens_details": {"cached_tokens": 2}}}))
    assert body["model"] == "tiergate-edge" and body["content"] == [{"type": "text", "text": "Hel"}]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 1, "cache_read_input_tokens": 2, "cache_creation_input_tokens": 0,
                             "output_tokens": 1}


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (403, "permission_error"), (404, "not_found_error"),
                                              (408, "invalid_request_error"), (413, "request_too_large"),
                                              (429, "rate_limit_error"), (500, "api_error"), (502, "api_error"),
                                              (503, "overloaded_error"), (504, "timeout_error")])
def test_error_types_by_status(status: int, kind: str) -> None:
    assert json.loads(anthropic_error(status, {"message": "m"})) == {"type": "error",
                                                                     "error": {"type": kind, "message": "m"}}
