"""`edge-node serve` as a real process on the real llama.cpp with a generated INT4 model."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import threading

import httpx
import pytest

from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def chat_body(text: str, **kw) -> dict:
    return {"model": "any", "messages": [{"role": "user", "content": text}], **kw}


def sse_events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def first_chunk_then_hold(client: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event,
                                release: asyncio.Event) -> list:
    """Stream a request; signal after the first content chunk; read the rest after `release`."""
    events = []
    async with client.stream("POST", url, json=body) as r:
        assert r.status_code == 200
        lines = r.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                events.extend(sse_events([line]))
                if isinstance(events[-1], dict) and events[-1]["choices"] and \
                        events[-1]["choices"][0]["delta"].get("content"):
                    break
        started.set()
        await release.wait()
        async for line in lines:
            events.extend(sse_events([line]))
    return events


@pytest.fixture
def long_node(edge_node_factory):
    """A node with room for long generations (thousands of tokens), so a request outlives client round trips."""
    return edge_node_factory("--parallel", "4", "--ctx", "4096")


LONG = 4000


def test_overlapping_streams_are_decoded_in_shared_batches(long_node):
    edge_node = long_node
    url = edge_node.url + "/v1/chat/completions"
    n = 3

    async def scenario():
        async with httpx.AsyncClient(timeout=120) as client:
            started = [asyncio.Event() for _ in range(n)]
            release = asyncio.Event()
            tasks = []
            for i in range(n):
                body = chat_body(f"stream {i}", stream=True, max_tokens=1500, temperature=0.8, seed=i)
                tasks.append(asyncio.create_task(first_chunk_then_hold(client, url, body, started[i], release)))
                await started[i].wait()  # request i is generating before i+1 starts
            health = (await client.get(edge_node.url + "/health")).json()
            release.set()
            return health, await asyncio.gather(*tasks)

    health, results = asyncio.run(scenario())
    assert health["busy"] == n  # all three were in slots at the same moment
    for events in results:
        assert events[-1] == "[DONE]"
        assert events[-2]["choices"][0]["finish_reason"] == "length"
    m = edge_node.metrics()
    decodes = m[("tiergate_edge_batch_sequences_count", ())]
    single = m[("tiergate_edge_batch_sequences_bucket", (("le", "1.0"),))]
    assert decodes - single > 0  # some llama_decode calls carried several sequences
    assert m[("tiergate_edge_multi_sequence_decodes_total", ())] == decodes - single
    assert m[("tiergate_edge_generation_tokens_total", ())] >= n * 1500


def test_client_disconnect_frees_the_slot_at_once(long_node):
    edge_node = long_node
    body = chat_body("never ending", stream=True, max_tokens=LONG, temperature=0.0)
    with httpx.Client(timeout=60) as client, client.stream("POST", edge_node.url + "/v1/chat/completions",
                                                           json=body) as r:
        lines = r.iter_lines()  # keep a reference: dropping the iterator would close the connection
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                break
        assert edge_node.health()["busy"] == 1
    # leaving the block closed the connection mid-stream
    wait_until(lambda: edge_node.health()["busy"] == 0, timeout_s=30, what="slot freed")
    assert edge_node.metric("tiergate_edge_requests_cancelled_total") == 1
    assert edge_node.metric("tiergate_edge_generation_tokens_total") < LONG


def test_queued_request_is_dropped_when_its_client_leaves(edge_node_factory):
    node = edge_node_factory("--parallel", "1", "--ctx", "4096")

    async def scenario():
        async with httpx.AsyncClient(timeout=60) as client:
            started, release = asyncio.Event(), asyncio.Event()
            running = asyncio.create_task(first_chunk_then_hold(
                client, node.url + "/v1/chat/completions",
                chat_body("first", stream=True, max_tokens=LONG, temperature=0.0), started, release))
            await started.wait()
            waiting = asyncio.create_task(client.post(node.url + "/v1/completions",
                                                      json={"model": "m", "prompt": "second", "max_tokens": 5}))
            for _ in range(500):
                if (await client.get(node.url + "/health")).json()["queued"] == 1:
                    break
                await asyncio.sleep(0.01)
            queued = (await client.get(node.url + "/health")).json()["queued"]
            waiting.cancel()
            for _ in range(500):
                if (await client.get(node.url + "/health")).json()["queued"] == 0:
                    break
                await asyncio.sleep(0.01)
            after = (await client.get(node.url + "/health")).json()
            running.cancel()
            return queued, after

    queued, after = asyncio.run(scenario())
    assert queued == 1 and after["queued"] == 0
    assert node.metric("tiergate_edge_requests_cancelled_total") >= 1


def test_greedy_batched_output_equals_single_sequence_output(edge_node):
    prompts = ["What is an edge node?", "Tell me a story about gateways", "2+2=?", "Translate: café au lait"]

    def ask(client, p):
        r = client.post(edge_node.url + "/v1/chat/completions",
                        json=chat_body(p, max_tokens=48, temperature=0.0))
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with httpx.Client(timeout=120) as client:
        alone = [ask(client, p) for p in prompts]
    before = edge_node.metric("tiergate_edge_multi_sequence_decodes_total")
    together: list[str | None] = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def worker(i):
        with httpx.Client(timeout=120) as client:
            barrier.wait()
            together[i] = ask(client, prompts[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert edge_node.metric("tiergate_edge_multi_sequence_decodes_total") > before


def test_prompt_longer_than_context_is_a_400_naming_the_limit(edge_node):
    r = httpx.post(edge_node.url + "/v1/completions",
                   json={"model": "m", "prompt": "lorem ipsum dolor " * 800, "max_tokens": 4}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert "1024 tokens" in err["message"] and err["param"] == "prompt"
    assert set(err) == {"message", "type", "code", "param"}


def test_bad_requests_get_openai_errors(edge_node):
    cases = [
        ({"model": "m", "messages": "nope"}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 9}, "temperature"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}, "n"),
    ]
    for body, param in cases:
        r = httpx.post(edge_node.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
    r = httpx.post(edge_node.url + "/v1/chat/completions", content=b"{not json", timeout=30)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    latin1 = '{"model": "m", "messages": [{"role": "user", "content": "caf\u00e9"}]}'.encode("latin-1")
    r = httpx.post(edge_node.url + "/v1/chat/completions", content=latin1, timeout=30)
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]["message"], r.text
    assert httpx.get(edge_node.url + "/v1/chat/completions", timeout=30).status_code == 405


def test_streaming_usage_and_done_marker(edge_node):
    body = {"model": "m", "prompt": "Once upon a time", "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    with httpx.stream("POST", edge_node.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 12
    finals = [e for e in events[:-2] if e["choices"][0]["finish_reason"]]
    assert [e["choices"][0]["finish_reason"] for e in finals] == ["length"]
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    whole = httpx.post(edge_node.url + "/v1/completions", json={**body, "stream": False}, timeout=60).json()
    assert whole["choices"][0]["text"] == text and whole["usage"]["completion_tokens"] == 12


def test_stop_string_finishes_with_stop(edge_node):
    base = chat_body("Count with me", max_tokens=40, temperature=0.0)
    full = httpx.post(edge_node.url + "/v1/chat/completions", json=base, timeout=60).json()
    text = full["choices"][0]["message"]["content"]
    stop = text.split()[len(text.split()) // 2]
    r = httpx.post(edge_node.url + "/v1/chat/completions", json={**base, "stop": [stop]}, timeout=60).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["message"]["content"] == text[: text.index(stop)]


def test_shared_prefix_is_reported_as_cached_tokens(edge_node):
    system = {"role": "system", "content": "You are the tiergate edge assistant. Answer briefly and precisely. " * 4}
    first = {"model": "m", "messages": [system, {"role": "user", "content": "one"}], "max_tokens": 4}
    second = {"model": "m", "messages": [system, {"role": "user", "content": "two"}], "max_tokens": 4}
    httpx.post(edge_node.url + "/v1/chat/completions", json=first, timeout=60).raise_for_status()
    usage = httpx.post(edge_node.url + "/v1/chat/completions", json=second, timeout=60).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 40
    assert edge_node.metric("tiergate_edge_prompt_tokens_cached_total") >= 40


def test_models_health_and_metrics_describe_the_node(edge_node):
    models = httpx.get(edge_node.url + "/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "tiergate-demo-tiny-q4_0" and models["data"][0]["max_model_len"] == 1024
    h = edge_node.health()
    assert (h["status"], h["slots"], h["busy"], h["queued"], h["ctx"]) == ("ok", 4, 0, 0, 1024)
    m = edge_node.metrics()
    assert m[("tiergate_edge_slots", ())] == 4
    assert m[("tiergate_edge_kv_cells_total", ())] == 4096
    for name in ("tiergate_edge_busy_slots", "tiergate_edge_queued_requests", "tiergate_edge_tokens_per_second",
                 "tiergate_edge_kv_usage_ratio"):
        assert (name, ()) in m


def test_openai_client_streams_from_the_node(edge_node):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=edge_node.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(model="tiergate-demo-tiny-q4_0", stream=True, max_tokens=8,
                                            messages=[{"role": "user", "content": "hello"}])
    chunks = list(stream)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


def test_sigterm_lets_in_flight_streams_finish_then_exits_cleanly(long_node):
    edge_node = long_node
    body = chat_body("long answer", stream=True, max_tokens=1500, temperature=0.0)
    events = []
    with httpx.Client(timeout=120) as client, client.stream("POST", edge_node.url + "/v1/chat/completions",
                                                            json=body) as r:
        lines = r.iter_lines()
        for line in lines:
            if '"content":"' in line and '"content":""' not in line:
                break
        edge_node.proc.send_signal(signal.SIGTERM)
        events = sse_events(lines)
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert edge_node.proc.wait(60) == 0
    assert '"draining"' in edge_node.log()


def test_non_streaming_client_that_gives_up_frees_its_slot(long_node):
    body = chat_body("patience", max_tokens=LONG, temperature=0.0)
    with httpx.Client() as client, pytest.raises(httpx.ReadTimeout):
        client.post(long_node.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    wait_until(lambda: long_node.health()["busy"] == 0, timeout_s=30, what="slot freed")
    assert long_node.metric("tiergate_edge_requests_cancelled_total") == 1
    assert long_node.metric("tiergate_edge_generation_tokens_total") < LONG
    assert long_node.metric("tiergate_edge_request_errors_total", code="internal") == 0
    assert "Traceback" not in long_node.log() and "InvalidStateError" not in long_node.log()


def test_a_full_queue_sheds_with_429_and_retry_after(edge_node_factory):
    node = edge_node_factory("--parallel", "1", "--max-queue", "1", "--ctx", "4096")
    url = node.url + "/v1/chat/completions"

    async def main() -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as c:
            started, release = asyncio.Event(), asyncio.Event()
            holder = asyncio.create_task(first_chunk_then_hold(
                c, url, chat_body("hold", max_tokens=LONG, temperature=0.0, stream=True), started, release))
            await started.wait()  # the only slot is busy
            queued = asyncio.create_task(c.post(url, json=chat_body("wait", max_tokens=4)))
            for _ in range(100):
                if node.health()["queued"] == 1:
                    break
                await asyncio.sleep(0.02)
            shed = await c.post(url, json=chat_body("no room", max_tokens=4))
            holder.cancel()
            queued.cancel()
            return shed

    r = asyncio.run(main())
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["code"] == "queue_full" and "--max-queue 1" in err["message"]
    assert node.metric("tiergate_edge_request_errors_total", code="queue_full") == 1


def test_bodies_over_the_limit_are_refused_before_being_read_whole(edge_node):
    url = edge_node.url + "/v1/chat/completions"
    conn = http.client.HTTPConnection("127.0.0.1", edge_node.port, timeout=30)
    try:  # declares 64 MiB, sends 2 bytes: answered at once, not after 30 s of waiting for the rest
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(64 << 20))
        conn.endheaders(b"{}")
        answer = conn.getresponse()
        assert answer.status == 413 and json.loads(answer.read())["error"]["code"] == "body_too_large"
    finally:
        conn.close()

    def chunked():  # no Content-Length: counted while it arrives
        for _ in range(20):
            yield b" " * (1 << 20)

    try:
        r = httpx.post(url, content=chunked(), timeout=30)
        assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]
    except httpx.WriteError:  # the node answered and closed before the client finished sending: also a refusal
        pass
    assert edge_node.metric("tiergate_edge_request_errors_total", code="body_too_large") >= 1


def test_request_ids_are_echoed_and_name_the_log_line(edge_node):
    url = edge_node.url + "/v1/chat/completions"
    r = httpx.post(url, json=chat_body("hi", max_tokens=2), headers={"x-request-id": "req-abc-123"}, timeout=60)
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-abc-123"
    generated = httpx.post(url, json=chat_body("hi", max_tokens=2), timeout=60).headers["x-request-id"]
    assert len(generated) == 32
    with httpx.stream("POST", url, json=chat_body("hi", max_tokens=2, stream=True),
                      headers={"x-request-id": "req-stream-9"}, timeout=60) as s:
        assert s.headers["x-request-id"] == "req-stream-9"
        list(s.iter_lines())

    def lines() -> list[dict]:
        return [json.loads(x) for x in edge_node.log().splitlines() if x.startswith("{")]

    wait_until(lambda: any(e.get("request_id") == "req-stream-9" and e.get("event") == "stream ended"
                           for e in lines()), timeout_s=10, what="the stream's end logged")
    done = [e for e in lines() if e.get("request_id") == "req-abc-123" and e.get("event") == "request"]
    assert done and done[0]["status"] == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "sigint"])
def test_what_outlives_the_drain_timeout_ends_with_an_explicit_error_and_no_traceback(edge_node_factory, sig):
    """One slot, four long requests (three streams, one JSON) held in flight (the node's test hook parks its
    decode loop) through a 2 s drain: every one of them ends with an explicit error (an SSE error event then
    [DONE], or an OpenAI error object), none with a cut connection, and the node exits 0 without a traceback."""
    node = edge_node_factory("--parallel", "1", "--ctx", "4096", "--drain-timeout", "2",
                             env={"TIERGATE_EDGE_TEST_HOOKS": "1"})
    streams: list[list] = [[] for _ in range(3)]
    answers: dict[str, httpx.Response] = {}
    began = threading.Event()

    def stream(i: int) -> None:
        body = chat_body(f"long answer {i}", stream=True, max_tokens=LONG, temperature=0.0)
        with httpx.stream("POST", node.url + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                streams[i].extend(sse_events([line]))
                if '"content":"' in line and '"content":""' not in line:
                    began.set()

    def whole() -> None:
        answers["json"] = httpx.post(node.url + "/v1/chat/completions", timeout=120,
                                     json=chat_body("long json", max_tokens=LONG, temperature=0.0))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)] + [threading.Thread(target=whole)]
    threads[0].start()
    assert began.wait(60)  # the first stream is in the slot, and has begun
    held = httpx.post(node.url + "/_test/hold", timeout=60).json()  # from now on nothing moves
    assert held == {"held": True, "in_flight": 1}
    for t in threads[1:]:
        t.start()
    wait_until(lambda: node.health()["queued"] == 3, timeout_s=60, what="three requests queued behind the slot")
    node.proc.send_signal(sig)
    for t in threads:
        t.join(120)
    assert node.proc.wait(60) == 0
    for events in streams:
        assert events and events[-1] == "[DONE]", events[-3:]
        last = events[-2]
        assert last["error"]["type"] == "server_error" and "shutting down" in last["error"]["message"], last
    r = answers["json"]
    assert r.status_code == 503 and "shutting down" in r.json()["error"]["message"], r.text[:300]
    assert "drain timeout: ending requests still in flight" in node.log()
    assert "Traceback" not in node.log(), node.log()[-3000:]


def test_test_hooks_are_off_unless_asked_for(edge_node):
    assert httpx.post(edge_node.url + "/_test/hold", timeout=10).status_code == 404


@pytest.mark.parametrize("bias", [1e39, 3.5e38], ids=["1e39", "just-over-float32-max"])
def test_a_poison_logit_bias_is_a_400_and_the_node_lives(edge_node, bias):
    """A bias of 1e39 is +inf in llama.cpp's float32 sampler: with a grammar (json_object) its -inf mask plus +inf
    is NaN, a forbidden token is sampled and llama-grammar aborts the process. The node refuses it instead."""
    body = chat_body("give json", max_tokens=8, temperature=0.0) | {
        "response_format": {"type": "json_object"}, "logit_bias": {"0": bias, "1": bias, "2": bias}}
    r = httpx.post(edge_node.url + "/v1/chat/completions", content=json.dumps(body), timeout=60,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    assert edge_node.proc.poll() is None
    ok = httpx.post(edge_node.url + "/v1/chat/completions", json=chat_body("hi", max_tokens=2), timeout=60)
    assert ok.status_code == 200 and edge_node.health()["status"] == "ok"
