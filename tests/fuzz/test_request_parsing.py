"""Hypothesis on request parsing: `decode_chat` / `decode_completion` and the mapping to OpenAI errors.

Whatever bytes or JSON a client sends, decoding either yields a typed request or raises one of msgspec's two
errors, and `from_validation` turns that error into a 400 in the OpenAI shape that names the offending field
(`param` plus the message) whenever msgspec located one. Requests that decode survive the re-encoding the
gateway does before sending them upstream.
"""

from __future__ import annotations

import re

import msgspec
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tiergate.core.errors import OpenAIError, from_validation
from tiergate.core.wire import ChatRequest, CompletionRequest, decode_chat, decode_completion, encode
from tiergate.gateway.fanout import plan

FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)
DECODERS = {"chat": decode_chat, "text": decode_completion}
_LOCATED = re.compile(r" - at `\$(?P<path>[^`]*)`$")

# ---- strategies ------------------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-(2**70), max_value=2**70),  # also beyond 64 bits
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20),
)
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=5)), max_leaves=25)

CHAT_FIELDS = ["model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
               "temperature", "top_p", "n", "stop", "seed", "presence_penalty", "frequency_penalty", "logit_bias",
               "logprobs", "top_logprobs", "user", "top_k", "min_p", "repetition_penalty", "tools", "tool_choice",
               "response_format"]
TEXT_FIELDS = ["model", "prompt", "stream", "stream_options", "max_tokens", "temperature", "top_p", "n", "stop",
               "seed", "echo", "suffix", "best_of", "logprobs", "user"]

roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function"])
content_parts = st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                                               optional={"text": st.text(max_size=20)}), max_size=3)
messages = st.lists(st.fixed_dictionaries({"role": roles},
                                          optional={"content": st.one_of(st.none(), st.text(max_size=40),
                                                                         content_parts),
                                                    "name": st.text(max_size=8)}), min_size=0, max_size=4)
VALID = {  # a valid value for each field, drawn per example
    "model": st.text(min_size=1, max_size=20), "messages": messages, "prompt": st.one_of(
        st.text(max_size=40), st.lists(st.text(max_size=20), max_size=3)),
    "stream": st.booleans(), "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
    "max_tokens": st.integers(-5, 5000), "max_completion_tokens": st.integers(-5, 5000),
    "temperature": st.floats(-1, 3), "top_p": st.floats(0, 1), "n": st.integers(0, 4),
    "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=3)),
    "seed": st.integers(-(2**40), 2**40), "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
    "logit_bias": st.dictionaries(st.text(max_size=5), st.floats(-100, 100), max_size=3),
    "logprobs": st.one_of(st.booleans(), st.integers(0, 5)), "top_logprobs": st.integers(0, 20),
    "user": st.text(max_size=10), "top_k": st.integers(0, 100), "min_p": st.floats(0, 1),
    "repetition_penalty": st.floats(0, 2), "tools": st.lists(st.dictionaries(st.text(max_size=5), json_values,
                                                                            max_size=3), max_size=2),
    "tool_choice": st.one_of(st.sampled_from(["auto", "none"]), st.dictionaries(st.text(max_size=5), json_values,
                                                                                max_size=2)),
    "response_format": st.dictionaries(st.text(max_size=5), json_values, max_size=2),
    "echo": st.booleans(), "suffix": st.text(max_size=5), "best_of": st.integers(0, 5),
}
# A value of a JSON type that each field never accepts (its wrong-type error must name the field).
WRONG = {
    "model": 5, "messages": "hello", "prompt": 7, "stream": "yes", "stream_options": [], "max_tokens": "ten",
    "max_completion_tokens": 1.5, "temperature": "hot", "top_p": [], "n": "one", "stop": 3, "seed": 1.25,
    "presence_penalty": "x", "frequency_penalty": {}, "logit_bias": [1], "logprobs": "x", "top_logprobs": "x",
    "user": 9, "top_k": "x", "min_p": "x", "repetition_penalty": "x", "tools": {}, "tool_choice": 3,
    "response_format": "json", "echo": "x", "suffix": 1, "best_of": "x",
}


def near_valid(kind: str) -> st.SearchStrategy[dict]:
    """Mostly well-formed bodies: every field valid or, now and then, any JSON value; unknown keys too."""
    names = CHAT_FIELDS if kind == "chat" else TEXT_FIELDS
    required = {"model", "messages"} if kind == "chat" else {"model", "prompt"}
    field = lambda n: st.one_of(VALID[n], VALID[n], VALID[n], json_values)
    return st.fixed_dictionaries({n: field(n) for n in names if n in required},
                                 optional={**{n: field(n) for n in names if n not in required},
                                           "extra_field": json_values})


# ---- the properties ------------------------------------------------------------------------------------------

def check_outcome(kind: str, body: bytes) -> ChatRequest | CompletionRequest | OpenAIError:
    """Decode like the gateway does; any exception but msgspec's two fails the test."""
    try:
        return DECODERS[kind](body)
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        exc = e
    err = from_validation(exc)
    assert isinstance(err, OpenAIError) and err.status == 400 and err.type == "invalid_request_error"
    body_json = msgspec.json.decode(err.to_json())
    assert set(body_json) == {"error"} and set(body_json["error"]) == {"message", "type", "code", "param"}
    assert isinstance(body_json["error"]["message"], str) and body_json["error"]["message"]
    m = _LOCATED.search(str(exc))
    if not isinstance(exc, msgspec.ValidationError):  # (ValidationError subclasses DecodeError)
        assert err.code == "invalid_json" and err.param is None
    else:
        assert err.code == "invalid_field"
        if m is not None and m["path"]:  # msgspec located the problem below the top level: name that field
            want = m["path"].removeprefix(".")
            missing = re.match(r"Object missing required field `([^`]+)`", str(exc))
            if missing:  # the missing field itself is named, below the object that lacks it
                want = f"{want}.{missing.group(1)}"
            assert err.param == want, (str(exc), err.param)
            assert f"`{err.param}`" in err.message
    return err


def check_decoded(req: ChatRequest | CompletionRequest, kind: str) -> None:
    """What the gateway does with a decoded request must not blow up, and re-encoding must be lossless."""
    assert isinstance(req.prompt_text(), str)
    mt = req.effective_max_tokens()
    assert mt is None or isinstance(mt, int)
    again = DECODERS[kind](encode(req))
    assert again == req


@pytest.mark.parametrize("kind", ["chat", "text"])
@FUZZ
@given(body=st.binary(max_size=300))
@example(body=b"")
@example(body=b"\xff\xfe{}")
@example(body=b'{"model": "auto", "messages": [')
def test_arbitrary_bytes(kind, body):
    out = check_outcome(kind, body)
    if not isinstance(out, OpenAIError):
        check_decoded(out, kind)


@pytest.mark.parametrize("kind", ["chat", "text"])
@FUZZ
@given(value=json_values)
def test_arbitrary_json(kind, value):
    out = check_outcome(kind, msgspec.json.encode(value))
    if not isinstance(out, OpenAIError):
        check_decoded(out, kind)


@pytest.mark.parametrize("kind", ["chat", "text"])
@FUZZ
@given(data=st.data())
def test_near_valid_bodies(kind, data):
    body = data.draw(near_valid(kind))
    out = check_outcome(kind, msgspec.json.encode(body))
    if not isinstance(out, OpenAIError):
        check_decoded(out, kind)


@pytest.mark.parametrize("kind", ["chat", "text"])
@FUZZ
@given(data=st.data())
def test_one_wrong_field_is_named(kind, data):
    """A valid body with exactly one field of the wrong type: the 400 names exactly that field."""
    names = [n for n in (CHAT_FIELDS if kind == "chat" else TEXT_FIELDS) if n in WRONG]
    body = data.draw(near_valid(kind))
    for n in list(body):
        body[n] = data.draw(VALID[n]) if n in VALID else None
    body.pop("extra_field", None)
    wrong = data.draw(st.sampled_from(names))
    body[wrong] = WRONG[wrong]
    # Other fields are valid in type, so the only possible validation error is the wrong one.
    out = check_outcome(kind, msgspec.json.encode(body))
    assert isinstance(out, OpenAIError), body
    assert out.param == wrong, (out.message, wrong)


@pytest.mark.parametrize("kind, path, body", [
    ("chat", "messages[1].content", {"model": "m", "messages": [{"role": "user", "content": "a"},
                                                                 {"role": "user", "content": 5}]}),
    ("chat", "messages[0].role", {"model": "m", "messages": [{"role": "robot", "content": "a"}]}),
    ("chat", "messages[0].content[0].text", {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": 1}]}]}),
    ("chat", "stream_options.include_usage", {"model": "m", "messages": [], "stream_options": {"include_usage": 1}}),
    ("text", "prompt[1]", {"model": "m", "prompt": ["a", 2]}),
])
def test_nested_field_paths(kind, path, body):
    out = check_outcome(kind, msgspec.json.encode(body))
    assert isinstance(out, OpenAIError) and out.param == path and f"`{path}`" in out.message


# ---- found by fuzzing: failing until core/errors.py and gateway/app.py are fixed (see docs/reliability.md) --

@pytest.mark.parametrize("kind, body, param", [
    ("chat", {"model": "m"}, "messages"),
    ("text", {"prompt": "p"}, "model"),
    ("chat", {"model": "m", "messages": [{"content": "hi"}]}, "messages[0].role"),
])
def test_missing_required_field_is_named_in_param(kind, body, param):
    out = check_outcome(kind, msgspec.json.encode(body))
    assert isinstance(out, OpenAIError) and out.param == param, (out.message, out.param)


@pytest.mark.parametrize("field", ["tools", "response_format", "tool_choice"])
def test_deeply_nested_json_is_a_validation_error(field):
    deep = b'{"a":' * 20_000 + b"1" + b"}" * 20_000
    inner = b"[" + deep + b"]" if field == "tools" else deep
    body = b'{"model":"m","messages":[{"role":"user","content":"x"}],"' + field.encode() + b'":' + inner + b"}"
    assert len(body) < (1 << 20)  # within the gateway's default body limit: any client can send it
    check_outcome("chat", body)


# ---- several answers: `gateway.fanout.plan` ------------------------------------------------------------------

prompts = st.one_of(st.text(max_size=10), st.lists(st.one_of(st.text(max_size=6), st.integers(-3, 3),
                                                             st.lists(st.integers(0, 9), max_size=3), st.none()),
                                                   max_size=12))
several = st.fixed_dictionaries({"model": st.just("auto")}, optional={
    "n": st.one_of(st.integers(-3, 12), st.integers(), st.booleans(), st.floats(0, 3), st.text(max_size=2),
                   st.none()),
    "prompt": prompts, "seed": st.one_of(st.integers(-(2**62), 2**62), st.text(max_size=3)),
    "stream": json_values, "stream_options": json_values, "messages": messages, "extra": json_values})


@FUZZ
@given(body=st.one_of(several, json_values), kind=st.sampled_from(["chat", "text"]),
       limit=st.integers(1, 16))
def test_a_request_for_several_answers_is_split_exactly_or_refused_with_a_400(body, kind, limit):
    """Any JSON: not split (one answer, or malformed: the pipeline answers it), a 400 naming `n` or `prompt`, or
    `n × prompts` single requests within the limit, in index order, each with one prompt and no `n`."""
    try:
        got = plan(msgspec.json.encode(body), kind, limit)
    except OpenAIError as exc:
        assert exc.status == 400 and exc.param in ("n", "prompt"), exc.body()
        return
    if got is None:
        return
    assert isinstance(body, dict)
    n = body.get("n") or 1
    listed = body["prompt"] if kind == "text" and isinstance(body.get("prompt"), list) else [None]
    assert len(got.bodies) == n * len(listed) <= limit and len(got.bodies) > 1
    assert got.cache is (n == 1)
    for i, raw in enumerate(got.bodies):
        sub = msgspec.json.decode(raw)
        assert "n" not in sub
        if listed != [None]:
            assert sub["prompt"] == listed[i // n] and isinstance(sub["prompt"], str)
        if n > 1 and isinstance(body.get("seed"), int) and not isinstance(body.get("seed"), bool):
            assert sub["seed"] == body["seed"] + i % n
