"""`edge-node` command line: bad input ends in one clear line and a non-zero exit; model tools work."""

from __future__ import annotations

import gguf
import httpx
import pytest
from aiohttp import web

from tests.support.edge import run_cli
from tests.support.servers import aiohttp_server, free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


def one_line_error(result) -> str:
    err = result.stderr.strip()
    assert result.returncode != 0, result
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("edge-node: error: ")
    return lines[0]


@pytest.fixture
def bad_files(tmp_path, edge_model):
    good = edge_model.gguf.read_bytes()
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a model\n")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(good[: len(good) // 3])
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(good[:64])
    return {"text": text, "truncated": truncated, "header": header_only}


def test_missing_model_file(tmp_path):
    line = one_line_error(run_cli("serve", "--model", str(tmp_path / "nope.gguf")))
    assert "model file not found" in line


@pytest.mark.parametrize(("which", "expect"), [("text", "not a GGUF"), ("truncated", "corrupt"), ("header", "corrupt")])
def test_damaged_or_foreign_model_file(bad_files, which, expect):
    assert expect in one_line_error(run_cli("serve", "--model", str(bad_files[which])))


def test_model_too_large_for_memory(edge_model):
    line = one_line_error(run_cli("serve", "--model", str(edge_model.gguf), "--ctx", "1000000", "--parallel", "256"))
    assert "too large for memory" in line and "GiB" in line


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["serve", "--model", "x.gguf", "--parallel", "0"], "--parallel"),
        (["serve", "--model", "x.gguf", "--bogus"], "--bogus"),
        (["serve"], "--model"),
        (["serve", "--model", "x.gguf", "--port", "http"], "--port"),
        (["quantize", "a.gguf", "b.gguf", "--type", "q9"], "unknown quantization type"),
        (["demo-model", "/tmp/x", "--size", "huge"], "unknown size"),
    ],
)
def test_bad_flags(args, expect):
    r = run_cli(*args)
    line = one_line_error(r)
    assert expect in line
    if args[0] == "serve":
        assert r.returncode == 2


def test_offline_hub_reference_says_so():
    line = one_line_error(run_cli("serve", "--model", "some-org/some-model-GGUF"))
    assert "Hugging Face" in line


def test_demo_model_and_quantize(tmp_path, edge_model):
    r = run_cli("demo-model", str(tmp_path / "f16"), "--quant", "f16")
    assert r.returncode == 0, r.stderr
    f16 = tmp_path / "f16" / "tiergate-demo-tiny-f16.gguf"
    assert (tmp_path / "f16" / "tokenizer.json").exists()
    out = tmp_path / "q4km.gguf"
    r = run_cli("quantize", str(f16), str(out), "--type", "q4_k_m")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size < f16.stat().st_size / 2.5

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_K"
    assert types["blk.0.attn_norm.weight"] == "F32"
    # same seed, same file
    r2 = run_cli("demo-model", str(tmp_path / "again"), "--quant", "q4_0")
    assert r2.returncode == 0
    assert (tmp_path / "again" / "tiergate-demo-tiny-q4_0.gguf").read_bytes() == edge_model.gguf.read_bytes()


def test_quantize_refuses_a_non_gguf_input(bad_files, tmp_path):
    line = one_line_error(run_cli("quantize", str(bad_files["text"]), str(tmp_path / "o.gguf")))
    assert "not a GGUF" in line


# ---------------------------------------------------------------- registration against a stand-in gateway


def recording_gateway(received: list) -> web.Application:
    async def heartbeat(request: web.Request):
        received.append(("heartbeat", request.headers.get("Authorization"), await request.json()))
        return web.json_response({"ok": True})

    async def deregister(request: web.Request):
        received.append(("deregister", request.headers.get("Authorization"), await request.json()))
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/edge/v1/heartbeat", heartbeat)
    app.router.add_post("/edge/v1/deregister", deregister)
    return app


def test_node_registers_heartbeats_and_deregisters_on_sigterm(edge_node_factory):
    received: list = []
    with aiohttp_server(recording_gateway(received)) as gw:
        node = edge_node_factory("--gateway", gw.url, "--token", "tok", "--node-id", "edge-a", "--parallel", "2")
        wait_until(lambda: sum(k == "heartbeat" for k, _, _ in received) >= 2, timeout_s=30, what="two heartbeats")
        assert node.stop() == 0
    _, auth, body = received[0]
    assert auth == "Bearer tok"
    assert body == {"node_id": "edge-a", "url": node.url, "model": "tiergate-demo-tiny-q4_0", "slots": 2,
                    "busy": 0, "queued": 0, "ctx": 2048, "tokens_per_s": 0.0}  # idle: no tokens generated yet
    assert received[-1] == ("deregister", "Bearer tok", {"node_id": "edge-a"})


def test_unreachable_gateway_does_not_stop_serving_and_registration_catches_up(edge_node_factory):
    port = free_port()
    node = edge_node_factory("--gateway", f"http://127.0.0.1:{port}", "--token", "t")
    r = httpx.post(node.url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    received: list = []
    with aiohttp_server(recording_gateway(received), port=port):
        wait_until(lambda: any(k == "heartbeat" for k, _, _ in received), timeout_s=60, what="late registration")
    assert "heartbeat failed" in node.log()
