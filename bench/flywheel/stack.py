"""The product bench/flywheel runs: a real gateway, two real SmolLM2 edge nodes, and a cloud stand-in.

- The cloud stand-in answers every question it knows from the gold answer, in the sentence bench/families.py
  gives it ("23 plus 45 is 68."): the production cloud tier is a 70B model, counted as right (as bench/cascade
  assumes). It is no model: no quality of a real cloud is measured here.
- The gateway runs the policy policies/examples/cascade.yaml with its rules as they are (the edge-with-cascade
  rule serves the load traffic), its tiers pointed at these servers and its cache off (the bench measures the
  model, not the cache), and two rules in front for the bench's tenants: `probe` is answered by the edge alone
  (the edge's own answer and its log-probabilities, scored and calibrated offline as bench/cascade does), and
  `acme`, the opted-in tenant, by the cloud (a rule listed in `distill.rules`, so every answer is captured).
- Two edge nodes (`edge-node serve --model smollm2-135m-instruct`, the packaged Q4_1 the fleet runs) with one
  shared `--lora-dir`: the rollout's canary and control.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from aiohttp import web

from bench.cascade.check import normalise
from bench.families import Question
from bench.procs import Server, free_port
from bench.report import REPO
from tests.support.servers import ThreadedGateway, aiohttp_server, gateway_server
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

__all__ = ["KEYS", "Stack", "StandInCloud", "policy_text", "stack"]

KEYS = {"acme": "key-acme-flywheel", "probe": "key-probe-flywheel", "load": "key-load-flywheel"}
EDGE_ARGS = ["--threads", "1", "--parallel", "2", "--ctx", "1024"]
CASCADE_POLICY = REPO / "policies" / "examples" / "cascade.yaml"


class StandInCloud:
    """Answers from the gold answers: an OpenAI chat endpoint that knows every bench question's reply."""

    def __init__(self, questions: Sequence[Question]) -> None:
        self.replies = {normalise(q.prompt): q.reply for q in questions}
        self.calls = 0

    def app(self) -> web.Application:
        async def complete(request: web.Request) -> web.StreamResponse:
            body = await request.json()
            self.calls += 1
            msgs = body.get("messages") or [{}]
            text = self.replies.get(normalise(str(msgs[-1].get("content") or "")), "I do not know.")
            usage = {"prompt_tokens": 20, "completion_tokens": len(text.split()) + 2}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            common = {"id": f"standin-{self.calls}", "created": int(time.time()), "model": "tiergate-cloud"}
            if not body.get("stream"):
                return web.json_response({**common, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for delta, finish in (({"role": "assistant", "content": text}, None), ({}, "stop")):
                chunk = {**common, "object": "chat.completion.chunk",
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(f"data: {json.dumps({**common, 'choices': [], 'usage': usage})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def health(_request: web.Request) -> web.Response:
            return web.json_response({"status": "ok", "slots": 64, "busy": 0, "queued": 0})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", complete)
        app.router.add_get("/health", health)
        return app


def policy_text(edges: Sequence[str], cloud: str) -> str:
    """policies/examples/cascade.yaml, pointed at these servers, cache off, with the bench's two tenant rules."""
    pol = yaml.safe_load(CASCADE_POLICY.read_text())
    pol["defaults"]["cache"] = {"enabled": False}
    pol["defaults"]["timeouts"] |= {"queue_s": 120, "first_byte_s": 120, "total_s": 300}
    pol["tiers"]["edge"] |= {"endpoints": list(edges), "max_context": 1024}  # the nodes' --ctx
    pol["tiers"]["cloud"].pop("discovery", None)
    pol["tiers"]["cloud"] |= {"endpoints": [cloud], "stand_in": True}
    pol["rules"] = [
        {"name": "flywheel-probe", "when": {"tenant": ["probe"]}, "tier": "edge"},
        {"name": "flywheel-capture", "when": {"tenant": ["acme"]}, "tier": "cloud"},
        *pol["rules"],
    ]
    pol["distill"]["rules"] = ["flywheel-capture", *pol["distill"].get("rules", [])]
    return "# bench/flywheel: policies/examples/cascade.yaml with the bench's servers (written by the bench)\n" \
        + yaml.safe_dump(pol, sort_keys=False)


@dataclass
class Stack:
    gateway: ThreadedGateway
    nodes: list[Server]
    cloud: StandInCloud
    lora_dir: Path
    records: Path

    @property
    def url(self) -> str:
        return self.gateway.url

    @property
    def node_urls(self) -> list[str]:
        return [n.health_url.removesuffix("/health") for n in self.nodes]

    def recorded(self) -> int:
        return int(self.gateway.gateway.registry.get_sample_value(
            "tiergate_distill_records_total", {"result": "recorded"}) or 0)


@contextmanager
def stack(work: Path, questions: Sequence[Question], log_dir: Path) -> Iterator[Stack]:
    """Start the stand-in cloud, two edge nodes and the gateway; stop them all when the block ends."""
    lora_dir = work / "lora"
    lora_dir.mkdir(parents=True, exist_ok=True)
    cloud = StandInCloud(questions)
    with ExitStack() as es:
        cloud_srv = es.enter_context(aiohttp_server(cloud.app()))
        nodes = []
        for i in range(2):
            port = free_port()
            node = Server(f"edge-{i}", [str(Path(sys.executable).parent / "edge-node"), "serve", "--model",
                                        "smollm2-135m-instruct", *EDGE_ARGS, "--lora-dir", str(lora_dir),
                                        "--port", str(port), "--model-name", "tiergate-edge"],
                          f"http://127.0.0.1:{port}/health", log=log_dir / f"flywheel-edge-{i}.log")
            es.callback(node.stop)
            node.start()
            nodes.append(node)
        policy = work / "policy.yaml"
        policy.write_text(policy_text([n.health_url.removesuffix("/health") for n in nodes], cloud_srv.url))
        records = work / "distill.jsonl"
        records.unlink(missing_ok=True)
        settings = Settings(policy=policy, embedder=None, redis_url=None, distill_file=records)
        keyring = KeyRing.from_inline(",".join(f"{k}={t}:normal" for t, k in KEYS.items()))
        gw = es.enter_context(gateway_server(settings, keyring=keyring, ready=False))
        yield Stack(gw, nodes, cloud, lora_dir, records)
