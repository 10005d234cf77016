"""The edge node's HTTP surface, served in-process by uvicorn over the real engine and the tiny INT4 model.

These tests break things on purpose (the engine, a handler, the client's connection) and check what the
client gets and what the node logs. `tests/integration/test_edge_node.py` runs `edge-node serve` as a process.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
import structlog
import uvicorn
from structlog.testing import LogCapture

from tests.support.servers import free_port
from tests.support.waiting import wait_until
from tiergate.edge_node.engine.engine import Engine
from tiergate.edge_node.engine.runtime import LlamaRuntime, RuntimeConfig
from tiergate.edge_node.engine.sampling import SamplerChain
from tiergate.edge_node.server import completions as edge_server
from tiergate.edge_node.server.app import ServerState, create_app


@dataclass
class Node:
    url: str
    port: int
    engine: Engine


@pytest.fixture
def node(edge_model) -> Iterator[Node]:
    """A fresh engine and server per test: several tests leave the engine dead."""
    yield from _serve(edge_model, 256)


@pytest.fixture
def roomy_node(edge_model) -> Iterator[Node]:
    """Room for a prompt that describes tools to the model."""
    yield from _serve(edge_model, 1024)


def _serve(edge_model, ctx_per_seq: int) -> Iterator[Node]:
    engine = Engine(LlamaRuntime(RuntimeConfig(model_path=edge_model.gguf, ctx_per_seq=ctx_per_seq, parallel=2)))
    port = free_port()
    config = uvicorn.Config(create_app(ServerState(engine=engine, model_name="tiny")), host="127.0.0.1", port=port,
                            loop="asyncio", lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, timeout_s=30, what="the edge server to start")
    try:
        yield Node(f"http://127.0.0.1:{port}", port, engine)
    finally:
        server.should_exit = True
        thread.join(15)
        engine.close()


@pytest.fixture
def logs() -> Iterator[list[dict]]:
    """Every structlog event of the test, at every level, with the request id bound by the server.

    structlog's configuration is per process and earlier tests set it (`configure_logging(level="warning")`
    drops info lines before any processor runs), so swapping the processors, as `capture_logs` does, is not
    enough: the level filter is lifted too, and both are put back afterwards.
    """
    was_configured, config = structlog.is_configured(), structlog.get_config()
    processors = config["processors"]  # the list itself, changed in place like capture_logs does
    saved, capture = processors.copy(), LogCapture()
    processors[:] = [structlog.contextvars.merge_contextvars, capture]
    structlog.configure(processors=processors, wrapper_class=structlog.make_filtering_bound_logger(logging.NOTSET))
    try:
        edge_server.log.info("capture check")  # the server's own logger must reach the capture
        assert [e["event"] for e in capture.entries] == ["capture check"], "log capture does not see edge_node"
        capture.entries.clear()
        yield capture.entries
    finally:
        processors[:] = saved
        structlog.configure(processors=processors, wrapper_class=config["wrapper_class"])
        if not was_configured:
            structlog.reset_defaults()


def chat_body(text: str = "hello", **kw) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": text}], **kw}


def sse_events(text: str) -> list:
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:])
            for line in text.splitlines() if line.startswith("data: ")]


def openai_error(r: httpx.Response) -> dict:
    """The error of an answer in OpenAI's format (and nothing else in the body)."""
    assert r.headers["content-type"] == "application/json", r.text
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
    return body["error"]


def errors_logged(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["log_level"] in ("error", "critical")]


def held_sampling(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold the decode loop at its first token until the test lets it go: a client can then leave while its
    request is generating, whatever the machine's speed. Returns (sampling, release)."""
    sample, sampling, release = SamplerChain.sample, threading.Event(), threading.Event()

    def held(self, *args, **kwargs):
        sampling.set()
        release.wait(10)  # a bound only against a hang: the test sets it
        return sample(self, *args, **kwargs)

    monkeypatch.setattr(SamplerChain, "sample", held)
    return sampling, release


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_dead_engine_fails_its_requests_refuses_new_ones_and_fails_health(node, monkeypatch, logs, stream):
    def broken(self, *args, **kwargs):
        raise RuntimeError("sampler exploded")

    monkeypatch.setattr(SamplerChain, "sample", broken)
    url = node.url + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:  # a hang is a ReadTimeout, not a stuck test
        r = client.post(url, json=chat_body(max_tokens=8, stream=stream))
        if stream:  # the headers were sent before the failure: an error event, then the usual end
            assert r.status_code == 200
            *_, error, done = sse_events(r.text)
            assert error["error"]["code"] == "engine_error" and "sampler exploded" in error["error"]["message"]
            assert done == "[DONE]"
        else:
            assert r.status_code == 500
            assert openai_error(r)["code"] == "engine_error"
        again = client.post(url, json=chat_body(max_tokens=8))  # refused, not queued behind a dead thread
        assert again.status_code == 503 and openai_error(again)["code"] == "engine_failed"
        health = client.get(node.url + "/health")
    assert health.status_code == 503
    assert health.json()["status"] == "failed" and "sampler exploded" in health.json()["error"]
    assert any(e["event"] == "engine loop crashed" for e in logs)


def test_an_unexpected_exception_is_a_500_in_the_openai_format_naming_the_request(node, monkeypatch, logs):
    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug in the handler")

    monkeypatch.setattr(node.engine, "tokenize_chat", bug)
    r = httpx.post(node.url + "/v1/chat/completions", json=chat_body(), headers={"x-request-id": "req-bug-1"},
                   timeout=10)
    assert r.status_code == 500 and r.headers["x-request-id"] == "req-bug-1"
    err = openai_error(r)
    assert (err["type"], err["code"]) == ("server_error", "internal_error") and "req-bug-1" in err["message"]
    [failure] = errors_logged(logs)
    assert failure["event"] == "request failed" and failure["request_id"] == "req-bug-1" and failure["exc_info"]
    # The node is fine otherwise: the next request is served.
    monkeypatch.undo()
    assert httpx.post(node.url + "/v1/chat/completions", json=chat_body(max_tokens=2), timeout=10).status_code == 200


def test_a_bug_mid_stream_ends_the_stream_with_an_error_event_and_done(node, monkeypatch, logs):
    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug while framing")

    monkeypatch.setattr("tiergate.edge_node.server.answers._usage", bug)  # runs after the last token, headers long sent
    body = chat_body(max_tokens=4, stream=True, stream_options={"include_usage": True})
    r = httpx.post(node.url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 200
    *_, error, done = sse_events(r.text)
    assert error["error"]["code"] == "internal_error" and done == "[DONE]"
    assert [e["event"] for e in errors_logged(logs)] == ["stream failed"]
    assert [e["outcome"] for e in logs if e["event"] == "stream ended"] == ["internal_error"]


def test_a_client_that_leaves_while_sending_its_body_is_not_an_error(node, logs):
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\nx-request-id: req-gone-1\r\n\r\n{\"model\": ")
    wait_until(lambda: any(e["event"] == "request" for e in logs), timeout_s=10, what="the request's end logged")
    [end] = [e for e in logs if e["event"] == "request"]
    assert end["status"] == 499 and end["request_id"] == "req-gone-1"
    assert errors_logged(logs) == []


def test_a_client_that_leaves_a_json_request_cancels_its_generation(node, monkeypatch, logs):
    sampling, release = held_sampling(monkeypatch)
    body = json.dumps(chat_body("patience", max_tokens=200)).encode()
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
                     b"x-request-id: req-leaves-1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert sampling.wait(10) and node.engine.stats().busy == 1  # generating, held at its first token
    # The server notices the client has gone and ends the request while the engine is still held.
    wait_until(lambda: any(e["event"] == "request" for e in logs), timeout_s=10, what="the request's end logged")
    release.set()
    wait_until(lambda: node.engine.stats().busy == 0, timeout_s=10, what="the slot to be freed")
    assert node.engine.metrics.cancelled._value.get() == 1
    [end] = [e for e in logs if e["event"] == "request"]
    assert end["status"] == 499 and end["request_id"] == "req-leaves-1" and end["completion_tokens"] == 0
    assert errors_logged(logs) == []
    r = httpx.post(node.url + "/v1/chat/completions", json=chat_body(max_tokens=2), timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_request_ids_are_echoed_or_made_and_the_log_lines_carry_them(node, logs):
    url = node.url + "/v1/chat/completions"
    given = httpx.post(url, json=chat_body(max_tokens=3), headers={"x-request-id": "req-abc-123"}, timeout=10)
    made = httpx.post(url, json=chat_body(max_tokens=3), timeout=10)
    assert given.status_code == made.status_code == 200
    assert given.headers["x-request-id"] == "req-abc-123"
    rid = made.headers["x-request-id"]
    assert len(rid) == 32 and rid != "req-abc-123"
    for request_id in ("req-abc-123", rid):
        mine = [e for e in logs if e.get("request_id") == request_id]
        assert [e["event"] for e in mine] == ["accepted", "request"]
        accepted, end = mine
        assert accepted["prompt_tokens"] > 0 and accepted["max_tokens"] == 3
        assert end["status"] == 200 and end["completion_tokens"] == 3 and end["ms"] > 0
        assert end["prompt_tokens"] == accepted["prompt_tokens"]


@pytest.mark.parametrize("path, body, param, code", [
    ("/v1/chat/completions", {"n": 2}, "n", "unsupported_parameter"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]},
     "messages[0].content[1].type", "unsupported_value"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]}]},
     "messages[0].content[0].type", "unsupported_value"),
    ("/v1/completions", {"logprobs": 2, "echo": True}, "echo", "unsupported_parameter"),
    ("/v1/completions", {"suffix": "end"}, "suffix", "unsupported_parameter"),
    ("/v1/completions", {"best_of": 2}, "best_of", "unsupported_parameter"),
])
def test_what_the_node_cannot_do_is_refused_with_a_code_that_sends_it_elsewhere(node, path, body, param, code):
    # The gateway hands a request refused with these codes to its next tier (docs/contracts.md, "Backends").
    base = {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    r = httpx.post(node.url + path, json={"model": "tiny", **base, "max_tokens": 4, **body}, timeout=10)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code)
    assert "not supported by the edge node" in err["message"]


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}


def _first_tokens(node: Node, pred) -> dict[str, float]:
    return {str(t): 100.0 for t in range(node.engine.rt.n_vocab) if pred(node.engine.rt.piece(t))}


@pytest.mark.parametrize("branch", ["call", "text"])
def test_tool_choice_auto_is_served_as_a_call_or_as_text_whole_and_streamed(roomy_node, branch):
    node = roomy_node
    # No tool_choice with tools is `auto`. The tiny model's choice is steered by a bias on the first character:
    # towards `{` it calls the tool, away from `{`/`[` it writes text; the grammar keeps either well formed.
    if branch == "call":
        bias = _first_tokens(node, lambda p: p.startswith(b"{"))
    else:
        bias = {t: -100.0 for t in _first_tokens(node, lambda p: p.lstrip()[:1] in (b"{", b"["))}
    body = chat_body("weather in Oslo?", tools=[TOOL], max_tokens=48, temperature=0, logit_bias=bias)
    whole = httpx.post(f"{node.url}/v1/chat/completions", json=body, timeout=60)
    assert whole.status_code == 200, whole.text
    [choice] = whole.json()["choices"]
    streamed = httpx.post(f"{node.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60)
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]" and "error" not in streamed.text
    deltas = [c["delta"] for e in events[:-1] for c in e["choices"]]
    finish = [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
    if branch == "call":
        [call] = choice["message"]["tool_calls"]
        assert choice["message"]["content"] is None and call["function"]["name"] == "get_weather"
        if choice["finish_reason"] == "tool_calls":  # else cut at max_tokens mid-call
            assert set(json.loads(call["function"]["arguments"])) == {"city"}
        [streamed_call] = [tc for d in deltas for tc in d.get("tool_calls") or []]
        assert streamed_call["function"]["arguments"] == call["function"]["arguments"]
        assert finish == [choice["finish_reason"]]
    else:
        text = choice["message"]["content"]
        assert text and text[0] not in "{[ " and "tool_calls" not in choice["message"]
        assert choice["finish_reason"] in ("stop", "length")
        assert "".join(d.get("content") or "" for d in deltas) == text and finish == [choice["finish_reason"]]
        assert not any(d.get("tool_calls") for d in deltas)


@pytest.mark.parametrize("path, base", [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                                        ("/v1/completions", {"prompt": "hi"})], ids=["chat", "text"])
@pytest.mark.parametrize("model", [{}, {"model": None}], ids=["left-out", "null"])
def test_a_request_without_a_model_is_served_by_the_nodes_one_model(node, path, base, model):
    # llama-server and vLLM allow it (llama.cpp's own server tests leave `model` out); the gateway still needs it.
    r = httpx.post(node.url + path, json={**base, **model, "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "tiny"
    bad = httpx.post(node.url + path, json={**base, "model": 3, "max_tokens": 2}, timeout=30)
    assert bad.status_code == 400 and openai_error(bad)["param"] == "model"
