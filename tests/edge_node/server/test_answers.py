"""The edge node's OpenAI objects, checked against the OpenAI SDK's own types: whole answers, stream chunks,
tool calls, usage, and both shapes of log-probabilities (with the text offsets that run across chunks)."""

from __future__ import annotations

import json

import msgspec
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tiergate.edge_node.engine.request import Chunk
from tiergate.edge_node.server.answers import Answer, sse
from tiergate.edge_node.server.logprobs import TokenLogprob
from tiergate.edge_node.server.structured import ToolCallOutput

LAST = Chunk("", "stop", prompt_tokens=12, completion_tokens=3, cached_tokens=8)
HELLO = TokenLogprob(1, b"Hello", -0.25, ((1, b"Hello", -0.25), (2, b"Hi", -1.5)))
COMMA = TokenLogprob(3, b",", -0.5, ((3, b",", -0.5), (4, b"!", -2.0)))
BROKEN = TokenLogprob(5, b"\xe2\x82", -3.0, ())  # half of a UTF-8 character


def events(data: bytes) -> list[dict]:
    assert data.startswith(b"data: ") and data.endswith(b"\n\n") and data.count(b"\n\n") == 1
    return json.loads(data[len(b"data: "):])


def test_sse_frames_one_json_event() -> None:
    assert sse({"a": [1, "é"]}) == b'data: {"a":[1,"\xc3\xa9"]}\n\n'


def test_a_whole_chat_answer_is_an_openai_chat_completion_with_usage() -> None:
    ans = Answer("chat", "tiny")
    got = ChatCompletion.model_validate_json(ans.whole("Hello, world", LAST, None))
    assert got.id == ans.id and got.id.startswith("chatcmpl-") and got.model == "tiny" and got.created == ans.created
    [choice] = got.choices
    assert choice.message.role == "assistant" and choice.message.content == "Hello, world"
    assert choice.finish_reason == "stop" and choice.logprobs is None
    assert got.usage is not None
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (12, 3, 15)
    assert got.usage.prompt_tokens_details is not None and got.usage.prompt_tokens_details.cached_tokens == 8


def test_ids_are_unique_per_answer() -> None:
    assert len({Answer("chat", "m").id for _ in range(100)}) == 100
    assert Answer("text", "m").id.startswith("cmpl-")


def test_a_tool_call_replaces_the_content_and_finishes_with_tool_calls() -> None:
    call = ToolCallOutput("get_weather", '{"city": "Oslo"}')
    got = ChatCompletion.model_validate_json(Answer("chat", "m").whole("ignored", LAST, None, [call]))
    [choice] = got.choices
    assert choice.message.content is None and choice.finish_reason == "tool_calls"
    [tc] = choice.message.tool_calls
    assert tc.type == "function" and tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments) == {"city": "Oslo"}
    cut = Chunk("", "length", 1, 2)
    assert json.loads(Answer("chat", "m").whole("", cut, None, [call]))["choices"][0]["finish_reason"] == "length"


def test_a_whole_text_completion_is_an_openai_completion() -> None:
    ans = Answer("text", "tiny")
    got = Completion.model_validate_json(ans.whole(" world", Chunk("", "length", 2, 5), None))
    assert got.object == "text_completion" and got.id == ans.id
    [choice] = got.choices
    assert choice.text == " world" and choice.finish_reason == "length" and choice.logprobs is None
    assert got.usage is not None and got.usage.total_tokens == 7


def test_chat_logprobs_have_tokens_bytes_and_alternatives() -> None:
    got = ChatCompletion.model_validate_json(Answer("chat", "m").whole("Hello,", LAST, [HELLO, COMMA, BROKEN]))
    lp = got.choices[0].logprobs
    assert lp is not None and lp.refusal is None
    assert [(t.token, t.logprob, t.bytes) for t in lp.content] == [
        ("Hello", -0.25, list(b"Hello")), (",", -0.5, [44]), ("\ufffd", -3.0, [0xE2, 0x82])]
    assert [(a.token, a.logprob) for a in lp.content[0].top_logprobs] == [("Hello", -0.25), ("Hi", -1.5)]
    assert lp.content[2].top_logprobs == []


def test_completion_logprobs_offsets_run_on_across_chunks_from_the_prompt_length() -> None:
    ans = Answer("text", "m", text_offset=10)
    first = events(ans.chunk("Hello", None, False, tokens=[HELLO]))["choices"][0]["logprobs"]
    second = events(ans.chunk(",", None, False, tokens=[COMMA, BROKEN]))["choices"][0]["logprobs"]
    assert first == {"tokens": ["Hello"], "token_logprobs": [-0.25], "top_logprobs": [{"Hello": -0.25, "Hi": -1.5}],
                     "text_offset": [10]}
    assert second["text_offset"] == [15, 16] and second["tokens"] == [",", "\ufffd"]
    # the chosen token is always among the alternatives, even when asked for none
    assert second["top_logprobs"] == [{",": -0.5, "!": -2.0}, {"\ufffd": -3.0}]
    assert Completion.model_validate({**events(ans.chunk("x", "stop", False, tokens=[])), "created": 1})


def test_chat_stream_chunks_open_with_the_role_and_carry_usage_only_when_asked() -> None:
    ans = Answer("chat", "m")
    opening = ChatCompletionChunk.model_validate_json(ans.chunk(None, None, True, role=True)[6:])
    assert opening.choices[0].delta.role == "assistant" and opening.choices[0].delta.content == ""
    assert opening.usage is None and "usage" in events(ans.chunk(None, None, True, role=True))
    piece = events(ans.chunk("Hel", None, False))
    assert "usage" not in piece and piece["choices"][0]["delta"] == {"content": "Hel"}
    assert piece["object"] == "chat.completion.chunk" and piece["id"] == ans.id
    last = ChatCompletionChunk.model_validate(events(ans.chunk("", "stop", False)))
    assert last.choices[0].finish_reason == "stop" and last.choices[0].delta.content is None
    usage = ChatCompletionChunk.model_validate(events(ans.usage(LAST)))
    assert usage.choices == [] and usage.usage is not None and usage.usage.total_tokens == 15


def test_text_stream_chunks_always_carry_text() -> None:
    ans = Answer("text", "m")
    got = events(ans.chunk(None, "stop", False))
    assert got["object"] == "text_completion" and got["choices"][0] == {
        "index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}


def test_a_streamed_tool_call_is_one_whole_delta() -> None:
    ans = Answer("chat", "m")
    got = ChatCompletionChunk.model_validate(events(ans.tool_call_chunk([ToolCallOutput("f", "{}")], False)))
    [tc] = got.choices[0].delta.tool_calls
    assert tc.index == 0 and tc.id and tc.function.name == "f" and tc.function.arguments == "{}"
    assert got.choices[0].finish_reason is None


def test_parallel_calls_are_indexed_in_one_delta_and_listed_whole() -> None:
    calls = [ToolCallOutput("f", '{"x": 1}'), ToolCallOutput("g", "{}")]
    got = ChatCompletionChunk.model_validate(events(Answer("chat", "m").tool_call_chunk(calls, False)))
    assert [(tc.index, tc.function.name) for tc in got.choices[0].delta.tool_calls] == [(0, "f"), (1, "g")]
    whole = ChatCompletion.model_validate_json(Answer("chat", "m").whole("", LAST, None, calls))
    assert [tc.function.name for tc in whole.choices[0].message.tool_calls] == ["f", "g"]
    assert len({tc.id for tc in whole.choices[0].message.tool_calls}) == 2


def test_answers_are_plain_json_bytes() -> None:
    assert msgspec.json.decode(Answer("chat", "m").whole("x", LAST, None))["object"] == "chat.completion"
