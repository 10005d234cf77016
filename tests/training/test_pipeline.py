"""The flywheel end to end on the tiny model: answers captured through a real gateway, exported, a LoRA trained a
few steps (and resumed), converted by llama.cpp's converter, gated in llama.cpp, and served by a real edge node.

The cloud is a stand-in that answers each arithmetic question right (as bench/cascade assumes of the cloud tier).
The tiny model's weights are random, so no gain is expected of it: the gate's verdict is checked against the
scores it measured, and the adapter is checked to change what the node answers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from aiohttp import web
from tokenizers import pre_tokenizers
from typer.testing import CliRunner

from tests.support.edge import run_cli
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.distill_cli import distill_app
from tiergate.gateway.settings import Settings
from tiergate.training.data import Example
from tiergate.training.lora import TokenizerMismatch, chat_texts, check_tokenizer, load_base

pytestmark = pytest.mark.integration
KEYS = KeyRing.from_inline("key-acme-1=acme:normal")
QUESTION = re.compile(r"what is (\d+) plus (\d+)\?")


def gold_cloud() -> web.Application:
    """Answers `what is A plus B?` with A+B: a cloud tier that is always right."""

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        m = QUESTION.search(body["messages"][-1]["content"])
        answer = str(int(m.group(1)) + int(m.group(2))) if m else "unknown"
        return web.json_response({
            "id": "c1", "object": "chat.completion", "created": int(time.time()), "model": "cloud",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "slots": 4, "busy": 0, "queued": 0})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_get("/health", health)
    return app


def _policy(path: Path, edge: str, cloud: str) -> Path:
    path.write_text(f"""
version: 1
defaults: {{cache: {{enabled: false}}, timeouts: {{connect_s: 1, total_s: 30}}}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: ["{edge}"]}}
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: default
    tier: edge
    fallbacks: [cloud]
distill: {{tenants: [acme]}}
""")
    return path


def _chat(url: str, text: str, key: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(url + "/v1/chat/completions", headers=headers, timeout=60, json={
        "model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 6, "temperature": 0})


def _tiergate(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tiergate.gateway.cli", "distill", *args], capture_output=True,
                          text=True, check=False, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=cwd)


def _capture(tmp_path: Path, n: int) -> Path:
    """`n` questions through a gateway whose edge is down: each falls back to the cloud and is recorded."""
    records = tmp_path / "distill.jsonl"
    with aiohttp_server(gold_cloud()) as cloud:
        settings = Settings(policy=_policy(tmp_path / "p.yaml", "http://127.0.0.1:9", cloud.url), embedder=None,
                            redis_url=None, distill_file=records)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            for i in range(n):
                r = _chat(gw.url, f"what is {i % 7 + 1} plus {i // 7 + 1}?", "key-acme-1")
                assert r.status_code == 200, r.text
            wait_until(lambda: (gw.gateway.registry.get_sample_value(
                "tiergate_distill_records_total", {"result": "recorded"}) or 0) == n, what=f"{n} records")
    out = tmp_path / "export.jsonl"
    r = CliRunner().invoke(distill_app, ["export", "--out", str(out), "--file", str(records)])
    assert r.exit_code == 0, r.output
    return out


def test_captured_answers_become_a_gated_adapter_a_real_edge_node_serves(tmp_path, edge_model, edge_node_factory):
    export = _capture(tmp_path, 42)
    rows = [json.loads(x) for x in export.read_text().splitlines()]
    assert len(rows) == 42 and rows[0]["messages"][-1] == {"role": "assistant", "content": "2"}

    run = tmp_path / "run"
    # `--out` relative, as an operator types it: the converter runs in llama.cpp's folder, not here
    common = [str(export), "--model", str(edge_model.gguf), "--out", "run", "--batch-size", "4", "--lr", "0.02"]
    first = _tiergate("train", *common, "--steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    second = _tiergate("train", *common, "--steps", "4", cwd=tmp_path)  # resumes from the checkpoint of step 2
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from the checkpoint at step 2" in second.stderr
    summary = json.loads(second.stdout.strip().splitlines()[-1])
    manifest = json.loads((run / "adapter.gguf.manifest.json").read_text())
    assert manifest["training"]["steps"] == 4 and manifest["data"]["unique_rows"] == 42
    assert summary["train_rows"] + summary["heldout_rows"] == 42 and summary["heldout_rows"] > 0
    adapter = tmp_path / summary["adapter"]
    assert adapter.read_bytes()[:4] == b"GGUF" and manifest["adapter_sha256"]

    regression = tmp_path / "regression.jsonl"
    regression.write_text("".join(json.dumps({"prompt": f"say {w}", "completion": w}) + "\n"
                                  for w in ("yes", "no", "river")))
    verdict_path = tmp_path / "verdict.json"
    gate = _tiergate("gate", "--model", str(edge_model.gguf), "--adapter", str(adapter), "--heldout",
                     str(run / "heldout.jsonl"), "--regression", str(regression), "--out", str(verdict_path),
                     "--margin", "5", "--max-tokens", "6")
    verdict = json.loads(verdict_path.read_text())
    gain = verdict["heldout"]["candidate"]["points"] - verdict["heldout"]["base"]["points"]
    lost = verdict["regression"]["base"]["points"] - verdict["regression"]["candidate"]["points"]
    assert verdict["heldout"]["base"]["total"] == summary["heldout_rows"] and verdict["regression"]["base"]["total"] == 3
    assert verdict["promote"] == (gain >= 5 and lost <= 2)
    assert gate.returncode == (0 if verdict["promote"] else 3), gate.stderr[-2000:]

    plain = edge_node_factory("--parallel", "2", "--ctx", "512")
    tuned = edge_node_factory("--parallel", "2", "--ctx", "512", "--lora", str(adapter))
    assert tuned.health()["lora"] == "adapter.gguf" and plain.health()["lora"] is None
    answers = {}
    for node in (plain, tuned):
        texts = []
        for q in ("what is 3 plus 4?", "what is 9 plus 9?", "hello there"):
            r = _chat(node.url, q)
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["message"]["content"])
        answers[node.url] = texts
    assert answers[plain.url] != answers[tuned.url]  # the adapter is applied: greedy answers change


def test_edge_node_refuses_an_adapter_it_cannot_load(tmp_path, edge_model):
    missing = run_cli("serve", "--model", str(edge_model.gguf), "--lora", str(tmp_path / "none.gguf"))
    assert missing.returncode != 0 and "none.gguf: no such file" in missing.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    bad = run_cli("serve", "--model", str(edge_model.gguf), "--lora", str(junk))
    assert bad.returncode != 0 and "could not load the LoRA adapter" in bad.stderr


def test_training_refuses_a_tokenizer_that_disagrees_with_llama_cpp(edge_model):
    base, tok = load_base(edge_model.gguf)
    texts = chat_texts(tok, [Example((("user", "the quick brown fox"),), "jumps over", 1)])
    check_tokenizer(edge_model.gguf, tok, texts)  # as loaded: the same ids as llama.cpp
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("e", "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    with pytest.raises(TokenizerMismatch, match="tokenize"):
        check_tokenizer(edge_model.gguf, tok, texts)
