"""`tiergate distill rollout` against real edge nodes under traffic: a worse adapter is rolled back from its canary,
a better one promoted to every node, and no request of the traffic fails meanwhile."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.support.lora import build_lora
from tiergate.gateway.distill_cli import distill_app

pytestmark = pytest.mark.integration
QUESTIONS = ("what is 2 plus 2?", "capital of France?", "say yes")


def _answer(url: str, text: str) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _probes(path: Path, answers: list[str]) -> Path:
    path.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n"
                            for q, a in zip(QUESTIONS, answers, strict=True)))
    return path


class Traffic:
    """Requests to every node, one after another, until stopped; counts the ones that did not answer 200."""

    def __init__(self, urls: list[str]) -> None:
        self.urls, self.sent, self.failed = urls, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
                    "model": "m", "messages": [{"role": "user", "content": "keep going"}], "max_tokens": 64})
                self.sent += 1
                self.failed += r.status_code != 200 or "error" in r.json()

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def test_a_worse_adapter_is_rolled_back_and_a_better_one_promoted_under_traffic(tmp_path, edge_model,
                                                                                edge_node_factory):
    loras = tmp_path / "loras"
    loras.mkdir()
    build_lora(loras / "v2.gguf", edge_model.shape)
    nodes = [edge_node_factory("--parallel", "2", "--ctx", "512", "--lora-dir", str(loras)) for _ in range(2)]
    reference = edge_node_factory("--parallel", "2", "--ctx", "512", "--lora", str(loras / "v2.gguf"))
    plain = [_answer(nodes[1].url, q) for q in QUESTIONS]
    tuned = [_answer(reference.url, q) for q in QUESTIONS]
    assert plain != tuned
    urls = [n.url for n in nodes]
    args = ["rollout", "--node", urls[0], "--node", urls[1], "--adapter", "v2.gguf", "--canary", "1",
            "--max-tokens", "12"]
    runner = CliRunner()
    with Traffic(urls) as traffic:
        # Probes whose right answers are the plain model's: the adapter is worse, so the canary goes back.
        worse = runner.invoke(distill_app, [*args, "--probes", str(_probes(tmp_path / "w.jsonl", plain))])
        assert worse.exit_code == 3, worse.output
        result = json.loads(worse.output.strip().splitlines()[-1])
        assert result["promoted"] is False and result["canary_points"] < result["control_points"]
        assert [n.health()["lora"] for n in nodes] == [None, None]

        better = runner.invoke(distill_app, [*args, "--probes", str(_probes(tmp_path / "b.jsonl", tuned)),
                                             "--margin", "10", "--out", str(tmp_path / "r.json")])
        assert better.exit_code == 0, better.output
        result = json.loads((tmp_path / "r.json").read_text())
        assert result["promoted"] is True and result["canary_points"] == 100.0 and result["control_points"] < 90
        assert [n.health()["lora"] for n in nodes] == ["v2.gguf", "v2.gguf"]
        assert [_answer(urls[1], q) for q in QUESTIONS] == tuned
    assert traffic.sent > 0 and traffic.failed == 0


def test_rollout_refuses_bad_input_with_one_line(tmp_path, edge_node):
    runner = CliRunner()
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n{"x": 1}\n')
    r = runner.invoke(distill_app, ["rollout", "--node", edge_node.url, "--node", edge_node.url, "--adapter", "a.gguf",
                                    "--probes", str(bad)])
    assert r.exit_code == 1 and f"{bad}:2: expected" in r.output
    good = _probes(tmp_path / "g.jsonl", ["a", "b", "c"])
    r = runner.invoke(distill_app, ["rollout", "--node", edge_node.url, "--adapter", "a.gguf", "--probes", str(good)])
    assert r.exit_code == 1 and "leave a node to compare with" in r.output
    r = runner.invoke(distill_app, ["rollout", "--node", edge_node.url, "--node", edge_node.url, "--adapter",
                                    "a.gguf", "--probes", str(good)])
    assert r.exit_code == 1 and "swaps are off" in r.output  # the node has no --lora-dir: nothing was changed
