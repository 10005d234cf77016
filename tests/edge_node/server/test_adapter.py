"""`POST /admin/lora` on a real edge node: the adapter changes while requests stream, none is dropped, the ones in
flight finish with the adapter they started with, and what follows answers as a node started with that adapter."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest

from tests.support.lora import build_lora

pytestmark = pytest.mark.integration
LONG = 600  # tokens: a stream still running when the swap is asked for
QUESTIONS = ("first question", "second question")


def _answer(url: str, text: str, max_tokens: int = 16) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _stream(url: str, text: str, started: threading.Event, out: dict[str, str]) -> None:
    """The streamed answer's text, or an error marker: out[text]."""
    parts = []
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
            "model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": LONG, "temperature": 0,
            "stream": True}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            started.set()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                parts.append("<error>")
            elif event["choices"]:
                parts.append(event["choices"][0]["delta"].get("content") or "")
    out[text] = "".join(parts)


def _swap(url: str, adapter: str | None) -> httpx.Response:
    return httpx.post(url + "/admin/lora", json={"adapter": adapter}, timeout=60)


def test_an_adapter_swaps_in_under_traffic_without_dropping_a_request(tmp_path: Path, edge_model, edge_node_factory):
    loras = tmp_path / "loras"
    loras.mkdir()
    adapter = build_lora(loras / "v2.gguf", edge_model.shape)
    node = edge_node_factory("--parallel", "4", "--ctx", "1024", "--lora-dir", str(loras))
    reference = edge_node_factory("--parallel", "4", "--ctx", "1024", "--lora", str(adapter))
    assert node.health()["lora"] is None
    plain, tuned = _answer(node.url, "hello there"), _answer(reference.url, "hello there")
    assert plain != tuned  # the adapter changes greedy answers: the test can tell which one served

    # Two long streams in flight when the swap is asked for: both finish, with the plain model's text.
    out: dict[str, str] = {}
    threads = []
    for q in QUESTIONS:
        started = threading.Event()
        t = threading.Thread(target=_stream, args=(node.url, q, started, out))
        t.start()
        assert started.wait(30)
        threads.append(t)
    r = _swap(node.url, "v2.gguf")
    assert r.status_code == 200 and r.json() == {"lora": "v2.gguf"}, r.text
    for t in threads:
        t.join(60)
    assert set(out) == set(QUESTIONS)
    assert node.health()["lora"] == "v2.gguf"
    assert _answer(node.url, "hello there") == tuned  # as a node started with the adapter: no stale KV reused

    assert _swap(node.url, None).json() == {"lora": None}
    assert _answer(node.url, "hello there") == plain
    for q in QUESTIONS:  # the streams in flight during the swap were answered by the plain model throughout
        assert out[q] == _answer(node.url, q, LONG)


@pytest.mark.parametrize(("body", "status", "says"), [
    ({"adapter": "../v2.gguf"}, 400, "file name of a .gguf"),
    ({"adapter": "v2.txt"}, 400, "file name of a .gguf"),
    ({"adapter": "missing.gguf"}, 404, "no adapter 'missing.gguf'"),
    ({"adapter": "junk.gguf"}, 400, "could not load the LoRA adapter"),
    ({"path": "/etc/passwd"}, 400, "body must be"),
])
def test_a_bad_swap_is_refused_and_the_current_adapter_keeps_serving(tmp_path, edge_model, edge_node_factory,
                                                                      body, status, says):
    loras = tmp_path / "loras"
    loras.mkdir()
    build_lora(loras / "v2.gguf", edge_model.shape)
    (loras / "junk.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    node = edge_node_factory("--parallel", "2", "--ctx", "512", "--lora-dir", str(loras), "--lora",
                             str(loras / "v2.gguf"))
    before = _answer(node.url, "hello there")
    r = httpx.post(node.url + "/admin/lora", json=body, timeout=60)
    assert r.status_code == status and says in r.json()["error"]["message"], r.text
    assert node.health()["lora"] == "v2.gguf" and _answer(node.url, "hello there") == before


def test_swaps_are_off_without_a_lora_dir(edge_node):
    r = _swap(edge_node.url, None)
    assert r.status_code == 404 and "--lora-dir" in r.json()["error"]["message"]
