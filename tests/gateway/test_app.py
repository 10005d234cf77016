"""The gateway's HTTP surface end to end: real uvicorn, real sockets, official openai SDK, instant backends."""

from __future__ import annotations

import asyncio
import socket
from contextlib import contextmanager

import httpx
import msgspec
import openai
import pytest
from aiohttp import web

from tests.gateway.conftest import KEYS, stack, write_policy
from tests.support.instant_upstream import HITS, LAST_BODY, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.settings import Settings

AUTH = {"Authorization": "Bearer key-alpha-1"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0}


def client(s) -> openai.OpenAI:
    return openai.OpenAI(base_url=s["gw"].url + "/v1", api_key="key-alpha-1", max_retries=0)


def test_sdk_chat_non_streaming(basic):
    raw = client(basic).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4, temperature=0)
    r = raw.parse()
    assert r.choices[0].message.content == "w0 w1 w2 w3 "
    assert r.usage.completion_tokens == 4
    assert raw.headers["x-tiergate-tier"] == "edge"
    assert raw.headers["x-tiergate-rule"] == "default"
    assert raw.headers["x-tiergate-cache"] == "miss"
    assert float(raw.headers["x-tiergate-overhead-ms"]) >= 0
    assert raw.headers["x-request-id"]


def test_sdk_streaming_with_usage(basic):
    stream = client(basic).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "Count"}], max_tokens=6, temperature=0.9, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "w0 w1 w2 w3 w4 w5 "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)


def test_streaming_without_usage_hides_the_usage_chunk(basic):
    chunks = list(client(basic).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "x"}], max_tokens=3, temperature=1, stream=True))
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_async_sdk_and_concurrent_requests(basic):
    async def main() -> list[str]:
        c = openai.AsyncOpenAI(base_url=basic["gw"].url + "/v1", api_key="key-alpha-1", max_retries=0)
        rs = await asyncio.gather(*[c.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2, temperature=1)
            for i in range(20)])
        await c.close()
        return [r.choices[0].message.content for r in rs]

    assert asyncio.run(main()) == ["w0 w1 "] * 20


def test_text_completions(basic):
    r = client(basic).completions.create(model="auto", prompt="Once upon", max_tokens=3, temperature=1)
    assert r.choices[0].text == "w0 w1 w2 "
    stream = client(basic).completions.create(model="auto", prompt="Once upon", max_tokens=3, temperature=1,
                                              stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == "w0 w1 w2 "


def test_explicit_model_routes_by_policy(basic):
    raw = client(basic).chat.completions.with_raw_response.create(
        model="tiergate-cloud", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert raw.headers["x-tiergate-tier"] == "cloud" and raw.headers["x-tiergate-rule"] == "explicit-cloud"
    assert raw.parse().model == "cloud-model"  # the backend's own model name, sent upstream


def test_models_lists_auto_and_tiers(basic):
    ids = [m.id for m in client(basic).models.list()]
    assert ids[0] == "auto" and set(ids) == {"auto", "tiergate-edge", "tiergate-cloud"}


def test_exact_cache_hit_and_streamed_replay(basic):
    c = client(basic)
    msgs = [{"role": "user", "content": "What is an edge tier?"}]
    first = c.chat.completions.with_raw_response.create(model="auto", messages=msgs, max_tokens=5, temperature=0)
    assert first.headers["x-tiergate-cache"] == "miss"
    hits_before = basic["edges"][0].app[HITS]
    second = c.chat.completions.with_raw_response.create(model="auto", messages=msgs, max_tokens=5, temperature=0)
    assert second.headers["x-tiergate-cache"] == "hit-exact" and second.headers["x-tiergate-tier"] == "cache"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert basic["edges"][0].app[HITS] == hits_before  # the backend was not asked again
    replay = list(c.chat.completions.create(model="auto", messages=msgs, max_tokens=5, temperature=0, stream=True))
    assert "".join(ch.choices[0].delta.content or "" for ch in replay if ch.choices) == "w0 w1 w2 w3 w4 "


# ---- bad input ------------------------------------------------------------------------------------------------

def _post(s, body: bytes | dict, headers=AUTH, path="/v1/chat/completions") -> httpx.Response:
    content = body if isinstance(body, bytes) else msgspec.json.encode(body)
    return httpx.post(s["gw"].url + path, content=content, headers={"content-type": "application/json", **headers})


def _err(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
    assert "Traceback" not in r.text
    return body["error"]


@pytest.mark.parametrize("body, status, code, words", [
    (b"{not json", 400, "invalid_json", "not valid JSON"),
    ({"model": "auto", "messages": "hello"}, 400, "invalid_field", "messages"),
    ({"model": "auto", "messages": [{"role": "user", "content": 5}]}, 400, "invalid_field", "messages[0].content"),
    ({"model": "auto", "messages": []}, 400, "invalid_request", "at least one message"),
    ({"model": "gpt-17", "messages": [{"role": "user", "content": "x"}]}, 404, "model_not_found", "gpt-17"),
    ({"model": "auto", "messages": [{"role": "user", "content": "x"}], "n": 9}, 400, "invalid_request", "`n`"),
    ({"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "invalid_request",
     "`max_tokens`"),
    ({"model": "auto", "messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 0},
     400, "invalid_request", "`max_completion_tokens`"),
    ({"model": "auto", "messages": [{"role": "user", "content": "x"}], "temperature": 7}, 400, "invalid_request",
     "temperature"),
])
def test_bad_requests_get_clear_openai_errors(basic, body, status, code, words):
    r = _post(basic, body)
    assert r.status_code == status
    err = _err(r)
    assert err["code"] == code and words in err["message"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Token key-alpha-1"}])
def test_missing_or_bad_key_is_401(basic, headers):
    r = _post(basic, CHAT, headers=headers)
    assert r.status_code == 401 and _err(r)["type"] == "authentication_error"


def test_oversized_body_and_prompt(tmp_path):
    with stack(tmp_path, settings={"max_body_bytes": 2000, "max_prompt_chars": 500}) as s:
        r = _post(s, {"model": "auto", "messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413 and _err(r)["code"] == "body_too_large"
        r = _post(s, {"model": "auto", "messages": [{"role": "user", "content": "x" * 1000}]})
        assert r.status_code == 413 and _err(r)["code"] == "prompt_too_large"


def test_unknown_route_and_method_are_json(basic):
    r = httpx.get(basic["gw"].url + "/v1/nothing")
    assert r.status_code == 404 and _err(r)["code"] == "unknown_url"
    r = httpx.get(basic["gw"].url + "/v1/chat/completions")
    assert r.status_code == 405 and _err(r)["code"] == "method_not_allowed"


# ---- backends failing ------------------------------------------------------------------------------------------

def test_failing_endpoint_is_retried_on_another_in_the_same_tier(tmp_path):
    with stack(tmp_path, edge_modes=("error500", "ok"), policy={"fallback": False}) as s:
        for _ in range(4):
            r = _post(s, {**CHAT, "temperature": 1})
            assert r.status_code == 200 and r.headers["x-tiergate-tier"] == "edge"


def test_edge_down_falls_back_to_cloud(tmp_path):
    with stack(tmp_path, edge_modes=("error500",)) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code == 200
        assert r.headers["x-tiergate-tier"] == "cloud" and r.headers["x-tiergate-fallback-from"] == "edge"


def test_everything_down_is_a_fast_explicit_error(tmp_path):
    with stack(tmp_path, edge_modes=("error500",), cloud_modes=("error500",)) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code in (502, 503) and _err(r)["type"] == "upstream_error"


def test_backend_verdict_on_the_request_is_relayed(tmp_path):
    with stack(tmp_path, edge_modes=("reject",), policy={"fallback": False}) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code == 400
        err = _err(r)
        assert err["code"] == "context_length_exceeded" and "context" in err["message"]


@contextmanager
def _refusing_edge(tmp_path, status: int, error: dict, *, cloud_mode: str = "ok"):
    """A gateway whose edge tier (falling back to the cloud) answers every completion with `status` and `error`."""
    app = web.Application()
    app[HITS] = 0

    async def complete(request: web.Request) -> web.Response:
        app[HITS] += 1
        await request.read()
        return web.json_response({"error": error}, status=status)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": "edge-model", "slots": 4, "busy": 0, "queued": 0})

    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", health)
    with aiohttp_server(app) as edge, aiohttp_server(make_app(8, cloud_mode, model="cloud-model")) as cloud:
        pol = write_policy(tmp_path / "policy.yaml", [edge.url], [cloud.url], cache=False)
        with gateway_server(Settings(policy=pol, embedder=None, redis_url=None), keyring=KEYS) as gw:
            yield {"gw": gw, "edges": [edge], "clouds": [cloud]}


_CANNOT = [  # how backends say "not me": the edge node's own answers, OpenAI's codes, a body over the backend's limit
    (400, {"message": "prompt has 1500 tokens; the context is 1024", "type": "invalid_request_error",
           "code": "context_length_exceeded", "param": "messages"}),
    (400, {"message": "logprobs are not supported by the edge node", "type": "invalid_request_error", "code": None,
           "param": "logprobs"}),
    (400, {"message": "response_format other than text is not supported by the edge node",
           "type": "invalid_request_error", "code": None, "param": "response_format"}),
    (400, {"message": "logprobs is not supported with this model", "type": "invalid_request_error",
           "code": "unsupported_parameter", "param": "logprobs"}),
    (413, {"message": "request body exceeds 65536 bytes", "type": "invalid_request_error", "code": "body_too_large",
           "param": None}),
    (400, {"message": "This model's maximum context length is 256 tokens. However, your prompt contains 300 input "
                      "tokens, which exceeds this limit even without any output tokens.",  # vLLM's own words
           "type": "BadRequestError", "code": 400, "param": None}),
    # vLLM without a tool-call parser (vllm serve without --tool-call-parser): every tool_choice but none
    (400, {"message": 'tool_choice="required" requires --tool-call-parser to be set', "type": "BadRequestError",
           "code": 400, "param": None}),
    (400, {"message": '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
           "type": "BadRequestError", "code": 400, "param": None}),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("status, error", _CANNOT, ids=[str(e["code"] or e["param"]) for _, e in _CANNOT])
def test_a_request_the_edge_cannot_serve_is_served_by_the_fallback_tier(tmp_path, status, error, stream):
    with _refusing_edge(tmp_path, status, error) as s:
        r = _post(s, {**CHAT, "stream": stream})
        assert r.status_code == 200, r.text
        assert r.headers["x-tiergate-tier"] == "cloud" and r.headers["x-tiergate-fallback-from"] == "edge"
        assert s["edges"][0].app[HITS] == 1  # the edge was asked once: its other endpoints are alike


def test_a_request_no_tier_can_serve_says_why_each_could_not(tmp_path):
    status, error = _CANNOT[0]
    with _refusing_edge(tmp_path, status, error, cloud_mode="error500") as s:
        r = _post(s, CHAT)
        assert r.status_code == 502
        message = _err(r)["message"]
        assert "Tier `edge` cannot serve this request: prompt has 1500 tokens" in message
        assert "Tier `cloud`" in message and "HTTP 500" in message


@pytest.mark.parametrize("error", [
    {"message": "messages[1]: a tool message must follow a tool call", "type": "invalid_request_error",
     "code": None, "param": "messages"},
    {"message": "invalid value for `stop`", "type": "invalid_request_error", "code": "invalid_value", "param": "stop"},
])
def test_the_edges_verdict_on_the_request_itself_is_not_retried_elsewhere(tmp_path, error):
    with _refusing_edge(tmp_path, 400, error) as s:
        r = _post(s, CHAT)
        assert r.status_code == 400
        err = _err(r)
        assert err["message"] == error["message"] and err["code"] == (error["code"] or "upstream_rejected")
        assert s["clouds"][0].app[HITS] == 0  # no other tier was bothered with it


def test_silent_backend_times_out_with_504(tmp_path):
    # A stream must start within the first-byte time; a JSON answer (whose headers come only once it is
    # generated) within the request's total time.
    with stack(tmp_path, edge_modes=("hang",), policy={"fallback": False, "first_byte_s": 0.5, "total_s": 1.0}) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code == 504 and _err(r)["code"] == "upstream_timeout"
        assert "1s" in _err(r)["message"]
        r = _post(s, {**CHAT, "temperature": 1, "stream": True})
        assert r.status_code == 504 and _err(r)["code"] == "upstream_timeout"
        assert "1.5s" in _err(r)["message"]  # connect 1 s + first byte 0.5 s


def test_json_answer_may_take_longer_than_the_first_byte_timeout(tmp_path):
    # The backend sends nothing, not even headers, for 2 s while it generates; connect + first byte is 1.3 s.
    with stack(tmp_path, edge_modes=("slow",), chunks=40, policy={"fallback": False, "first_byte_s": 0.3}) as s:
        r = _post(s, {**CHAT, "temperature": 1, "max_tokens": 40})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 40


def test_stream_stalling_mid_way_ends_with_sse_error_and_the_connection_stays_usable(tmp_path):
    with stack(tmp_path, edge_modes=("stall",), policy={"fallback": False, "between_chunks_s": 0.3}) as s, \
            httpx.Client(base_url=s["gw"].url, headers=AUTH, timeout=10) as http:
        with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True, "temperature": 1}) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert [msgspec.json.decode(e)["choices"][0]["delta"]["content"] for e in events[:2]] == ["w0 ", "w1 "]
        err = msgspec.json.decode(events[2])["error"]
        assert err["code"] == "upstream_timeout" and "silent" in err["message"]
        assert events[3:] == ["[DONE]"]
        assert http.get("/healthz").status_code == 200  # the gateway still serves the same client afterwards


def test_backend_rejecting_the_gateway_itself_is_an_endpoint_failure(tmp_path):
    # A 401 from a backend is about the gateway's configuration, not the client's request: try elsewhere,
    # and never hand the client a 401 that its own (valid) key did not earn.
    with stack(tmp_path, edge_modes=("unauthorized",)) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code == 200 and r.headers["x-tiergate-fallback-from"] == "edge"
    with stack(tmp_path, edge_modes=("unauthorized",), cloud_modes=("error500",)) as s:
        r = _post(s, {**CHAT, "temperature": 1})
        assert r.status_code == 502
        err = _err(r)
        assert err["type"] == "upstream_error"
        assert "Tier `edge`" in err["message"] and "HTTP 401" in err["message"]  # every tier's failure is named
        assert "Tier `cloud`" in err["message"] and "HTTP 500" in err["message"]


def test_fields_the_gateway_does_not_model_reach_the_backend_and_bypass_the_cache(basic):
    backend = basic["edges"][0].app
    extra = {"reasoning_effort": "low", "parallel_tool_calls": False, "functions": [{"name": "f", "parameters": {}}]}
    for _ in range(2):
        r = _post(basic, {**CHAT, **extra})
        assert r.status_code == 200 and r.headers["x-tiergate-cache"] == "bypass"
        sent = msgspec.json.decode(backend[LAST_BODY])
        assert {k: sent.get(k) for k in extra} == extra and sent["model"] == "edge-model"
    # A field known not to change the answer keeps the request cacheable.
    assert _post(basic, {**CHAT, "metadata": {"app": "x"}}).headers["x-tiergate-cache"] == "miss"
    assert _post(basic, {**CHAT, "metadata": {"app": "x"}}).headers["x-tiergate-cache"] == "hit-exact"
    assert msgspec.json.decode(backend[LAST_BODY])["metadata"] == {"app": "x"}


TEXT = {"model": "auto", "prompt": "Once upon", "max_tokens": 4, "temperature": 1}


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", {**CHAT, "n_predict": 5000}, "n_predict"),  # llama.cpp prefers it over max_tokens
    ("/v1/completions", {**TEXT, "n_predict": -1}, "n_predict"),  # -1: until the context is full
    ("/v1/completions", {**TEXT, "max_completion_tokens": 5000}, "max_completion_tokens"),
    ("/v1/completions", {**TEXT, "best_of": 8}, "best_of"),  # modelled for text completions, one sequence only
    ("/v1/chat/completions", {**CHAT, "best_of": 8}, "best_of"),
    ("/v1/chat/completions", {**CHAT, "n_cmpl": 4}, "n_cmpl"),
    ("/v1/chat/completions", {**CHAT, "use_beam_search": True}, "use_beam_search"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 4000}, "min_tokens"),
    ("/v1/chat/completions", {**CHAT, "ignore_eos": True}, "ignore_eos"),
    ("/v1/completions", {**TEXT, "priority": -100}, "priority"),
    ("/v1/chat/completions", {**CHAT, "id_slot": 0}, "id_slot"),
    ("/v1/chat/completions", {**CHAT, "prompt_logprobs": 5}, "prompt_logprobs"),
    ("/v1/chat/completions", {**CHAT, "kv_transfer_params": {"do_remote_prefill": True}}, "kv_transfer_params"),
])
def test_fields_that_would_step_around_the_gateways_limits_are_refused(basic, path, body, field):
    backend = basic["edges"][0].app
    hits = backend[HITS]
    r = _post(basic, body, path=path)
    assert r.status_code == 400
    err = _err(r)
    assert err["param"] == field and f"`{field}" in err["message"]
    assert err["code"] == ("invalid_request" if field == "best_of" and path == "/v1/completions"
                           else "unsupported_parameter")
    assert backend[HITS] == hits  # refused before any backend saw it


def test_the_values_of_controlled_fields_that_change_nothing_are_forwarded(basic):
    neutral = {"n_predict": None, "n_cmpl": 1, "best_of": 1, "use_beam_search": False, "min_tokens": 0,
               "ignore_eos": False, "priority": 0, "id_slot": -1, "prompt_logprobs": None, "n_probs": 5,
               "n_keep": 10, "min_p": 0.1}
    r = _post(basic, {**CHAT, **neutral})
    assert r.status_code == 200, r.text
    sent = msgspec.json.decode(basic["edges"][0].app[LAST_BODY])
    assert {k: sent.get(k, "absent") for k in neutral} == neutral


def test_fields_the_structs_do_not_model_at_any_depth_reach_the_backend_as_sent(basic):
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is in this?"},
                                     {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                                     {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": "{\"q\": 1}"},
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"},
                         "index": 0, "x_vendor": [1, 2.50, None]}], "refusal": None},
        {"role": "function", "name": "lookup", "content": "42"},
        {"role": "user", "content": "and now?", "x_meta": {"nested": {"deeper": True}}},
    ]
    body = {**CHAT, "messages": messages, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "stream": True}
    r = _post(basic, body)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    sent = msgspec.json.decode(basic["edges"][0].app[LAST_BODY])
    assert sent["messages"] == messages
    assert sent["model"] == "edge-model" and sent["max_tokens"] == 4
    assert sent["stream_options"] == {"include_usage": True}  # the gateway's own: it needs the usage chunk


@pytest.mark.parametrize("message", [
    {"role": "user", "content": "What is an edge tier?", "x_meta": {"version": 2}},
    {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                 {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
])
def test_a_message_with_fields_the_cache_cannot_key_on_bypasses_the_cache(basic, message):
    # The backend gets these fields (so the answer may depend on them), the cache's key would not include them.
    backend = basic["edges"][0].app
    hits = backend[HITS]
    for _ in range(2):
        r = _post(basic, {**CHAT, "messages": [message]})
        assert r.status_code == 200 and r.headers["x-tiergate-cache"] == "bypass"
    assert backend[HITS] == hits + 2


def test_stream_cut_mid_way_ends_with_sse_error_then_done(tmp_path):
    with stack(tmp_path, edge_modes=("cut",), policy={"fallback": False}) as s:
        with httpx.stream("POST", s["gw"].url + "/v1/chat/completions", headers=AUTH,
                          json={**CHAT, "stream": True, "temperature": 1, "max_tokens": 8}) as r:
            assert r.status_code == 200
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        err = msgspec.json.decode(events[-2])
        assert err["error"]["type"] == "upstream_error"
        assert "w0 " in events[0]  # the part that arrived was relayed


def test_a_stream_that_breaks_before_its_usage_chunk_is_still_charged(tmp_path):
    def tokens(kind: str) -> float:
        return s["gw"].gateway.registry.get_sample_value("tiergate_tokens_total",
                                                         {"tier": "edge", "kind": kind}) or 0.0

    with stack(tmp_path, edge_modes=("cut",), policy={"fallback": False}) as s:
        before = tokens("prompt"), tokens("completion")
        with httpx.stream("POST", s["gw"].url + "/v1/chat/completions", headers=AUTH,
                          json={**CHAT, "stream": True, "temperature": 1, "max_tokens": 8}) as r:
            content = [line for line in r.iter_lines() if line.startswith('data: {"id"')]
        assert len(content) == 4  # the backend died half-way through 8 tokens, before any usage chunk
        wait_until(lambda: tokens("completion") == before[1] + 4, timeout_s=3, what="the 4 relayed tokens charged")
        assert tokens("prompt") > before[0]  # the gateway's own count of the prompt


def test_client_leaving_while_sending_its_body_is_no_internal_error(basic):
    def gone() -> float:
        return basic["gw"].gateway.registry.get_sample_value("tiergate_client_disconnects_total",
                                                             {"tier": "none"}) or 0.0

    before = gone()
    port = int(basic["gw"].url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-alpha-1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\": \"auto\"")
    wait_until(lambda: gone() == before + 1, timeout_s=3, what="the abandoned request counted as a disconnect")
    assert _post(basic, CHAT).status_code == 200


def test_openai_sdk_sees_mid_stream_error(tmp_path):
    with stack(tmp_path, edge_modes=("cut",), policy={"fallback": False}) as s, pytest.raises(openai.APIError):
        list(client(s).chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}],
                                               max_tokens=8, temperature=1, stream=True))


def test_the_gateway_under_test_runs_as_in_production(basic):
    """uvloop and httptools, as `tiergate serve` runs it (tests/support/servers.py)."""
    gw = basic["gw"]
    assert type(gw.gateway.upstream.session._loop).__module__.startswith("uvloop")
    assert gw.server.config.http == "httptools"
