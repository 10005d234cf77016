import msgspec
import pytest

from tiergate.cache.types import CachedAnswer
from tiergate.core.errors import OpenAIError, from_validation, rate_limited
from tiergate.core.wire import decode_chat, decode_completion, encode
from tiergate.gateway.render import StreamAccumulator, cacheable, render_json, render_sse, summarize


def test_chat_request_decodes_and_keeps_the_kind_out_of_the_wire_format():
    req = decode_chat(b'{"model":"auto","messages":[{"role":"user","content":"hi"}],"temperature":0}')
    assert req.kind == "chat" and req.prompt_text() == "hi"
    assert b"kind" not in encode(req)


def test_content_parts_are_joined_for_classification():
    req = decode_chat(b'{"model":"auto","messages":[{"role":"system","content":"be brief"},'
                      b'{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}')
    assert req.prompt_text() == "be brief\na\nb"


@pytest.mark.parametrize(
    "body, param",
    [
        (b'{"model":"auto","messages":"hi"}', "messages"),
        (b'{"model":"auto","messages":[{"role":"robot","content":"x"}]}', "messages[0].role"),
        (b'{"model":"auto","messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}', "max_tokens"),
        (b'{"messages":[]}', "model"),  # a missing field is named itself
    ],
)
def test_validation_errors_name_the_field(body, param):
    with pytest.raises(msgspec.ValidationError) as ei:
        decode_chat(body)
    err = from_validation(ei.value)
    assert err.status == 400 and err.code == "invalid_field"
    assert err.param == param
    assert param in err.message


def test_invalid_json_is_a_400_saying_so():
    with pytest.raises(msgspec.DecodeError) as ei:
        decode_completion(b'{"model": "auto", "prompt": ')
    err = from_validation(ei.value)
    assert err.status == 400 and err.code == "invalid_json" and "not valid JSON" in err.message


def test_error_body_is_openai_shaped():
    body = msgspec.json.decode(OpenAIError(404, "nope", code="model_not_found", param="model").to_json())
    assert body == {"error": {"message": "nope", "type": "invalid_request_error", "code": "model_not_found",
                              "param": "model"}}
    assert rate_limited("slow down", 2.4).headers == {"retry-after": "3"}  # rounded up: a client is never early


ANSWER = CachedAnswer("chat", "Hello there, " * 12, "stop", "tiergate-edge", "edge", 7, 30, 0)


def test_cached_answer_renders_as_a_completion():
    obj = msgspec.json.decode(render_json(ANSWER))
    assert obj["object"] == "chat.completion"
    assert obj["choices"][0]["message"]["content"] == ANSWER.text
    assert obj["usage"] == {"prompt_tokens": 7, "completion_tokens": 30, "total_tokens": 37}
    s = summarize(render_json(ANSWER))
    assert (s.text, s.finish_reason, s.completion_tokens) == (ANSWER.text, "stop", 30)


@pytest.mark.parametrize("kind", ["chat", "text"])
def test_cached_answer_replays_as_sse_that_reassembles_exactly(kind):
    a = msgspec.structs.replace(ANSWER, kind=kind)
    events = render_sse(a, include_usage=True)
    assert events[-1] == b"data: [DONE]\n\n"
    acc = StreamAccumulator()
    usage_chunks = [acc.feed(e[6:-2]) for e in events[:-1]]
    assert acc.text == a.text and acc.finish_reason == "stop"
    assert usage_chunks[-1] is True and (acc.prompt_tokens, acc.completion_tokens) == (7, 30)
    assert len(events) > 3  # split into several chunks like a live stream


def _chat_body(*finish_reasons: str | None) -> bytes:
    return msgspec.json.encode({"model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 4}, "choices": [
        {"index": i, "message": {"role": "assistant", "content": f"answer {i}"}, "finish_reason": r}
        for i, r in enumerate(finish_reasons)]})


@pytest.mark.parametrize(("finish_reasons", "stored"), [
    (("stop",), True), (("length",), True), (("tool_calls",), False), (("content_filter",), False),
    ((None,), False), ((), False), (("stop", "stop"), False)])
def test_only_complete_single_choice_answers_are_cacheable_from_json_and_from_a_stream(finish_reasons, stored):
    summary = summarize(_chat_body(*finish_reasons))
    acc = StreamAccumulator()
    for i, r in enumerate(finish_reasons):  # the same answer, streamed: one content delta, then its finish reason
        acc.feed(msgspec.json.encode({"model": "m", "choices": [{"index": i, "delta": {"content": f"answer {i}"}}]}))
        acc.feed(msgspec.json.encode({"model": "m", "choices": [{"index": i, "delta": {}, "finish_reason": r}]}))
    acc.feed(b'{"model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}')
    for a in (summary, acc):
        got = cacheable(a, "chat", "edge")
        assert (got is not None) == stored
        if got is not None:
            assert (got.kind, got.text, got.finish_reason, got.model, got.tier) == (
                "chat", "answer 0", finish_reasons[0], "m", "edge")
            assert (got.prompt_tokens, got.completion_tokens) == (3, 4) and got.created > 0


@pytest.mark.parametrize("body", [b'{"choices":[{"index":0,"text":"\xff\xfe"}]}', b'{"model":"m\xed\xa0\x80"}',
                                  b'{"choices":' + b"[" * 100_000 + b"]" * 100_000 + b"}"])
def test_a_backend_answer_that_is_not_utf8_or_too_deep_is_a_decode_error(body):
    """A backend's bytes go through the same decoding as a client's: only msgspec's errors, which relay and dispatch
    turn into `upstream_protocol` (a JSON answer) or relay as the backend's own chunk (a stream), never a 500."""
    with pytest.raises(msgspec.DecodeError):
        summarize(body)
    with pytest.raises(msgspec.DecodeError):
        StreamAccumulator().feed(body)
