"""`tiergate prepare` and `tiergate demo`: the whole product on one machine, with no GPU, Redis or downloads.

The demo starts real processes: a llama.cpp edge node (a small INT4 GGUF model built locally), a second
llama.cpp server standing in for the cloud tier (vLLM needs a GPU or its own heavy CPU build; the logs and
/v1/models say it is a stand-in), and the gateway on top with the in-memory semantic cache.
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

from cache.export import default_embedder_dir, export_embedder, is_complete
from edge_node.demo_model import build_demo_model
from gateway.auth import DEMO_KEY
from gateway.settings import Settings
from policies.loader import load_policy

__all__ = ["Artifacts", "contexts", "prepare", "run_demo"]

console = Console(stderr=True)


@dataclass(frozen=True, slots=True)
class Artifacts:
    edge_model: Path
    cloud_model: Path
    tokenizer: Path
    embedder: Path


def home() -> Path:
    """Where generated models live: $TIERGATE_HOME, else `.tiergate/` in the source tree."""
    env = os.environ.get("TIERGATE_HOME")
    return Path(env) if env else Path(__file__).resolve().parent.parent / ".tiergate"


def prepare(quiet: bool = False) -> Artifacts:
    """Build the demo models and export the embedder, once (each step is skipped when already done)."""
    say = (lambda _m: None) if quiet else (lambda m: console.print(f"  {m}"))
    models = home() / "models"
    edge = models / "edge" / "tiergate-demo-tiny-q4_0.gguf"
    cloud = models / "cloud" / "tiergate-demo-tiny-q4_k_m.gguf"
    if not edge.exists():
        with console.status("building the edge demo model (INT4, llama.cpp quantizer)"):
            build_demo_model(edge.parent, size="tiny", quant="q4_0", seed=0, progress=say)
    if not cloud.exists():
        with console.status("building the cloud stand-in model"):
            build_demo_model(cloud.parent, size="tiny", quant="q4_k_m", seed=1, progress=say)
    emb = default_embedder_dir()
    if not is_complete(emb):
        with console.status("exporting all-MiniLM-L6-v2 to ONNX (once)"):
            export_embedder(emb)
    return Artifacts(edge, cloud, edge.parent / "tokenizer.json", emb)


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
        p = subprocess.Popen(args, env=env)
        procs.append((name, p))
        _wait_http(health, timeout_s, p, name)

    try:
        start("cloud tier (LOCAL STAND-IN: llama.cpp, not vLLM)",
              [str(bindir / "edge-node"), "serve", "--model", str(art.cloud_model), "--port", "8090",
               "--model-name", "cloud-standin", "--parallel", "4", "--ctx", str(ctx["cloud"])],
              "http://127.0.0.1:8090/health")
        start("gateway", [str(bindir / "tiergate"), "serve", "--port", str(port)],
              f"http://127.0.0.1:{port}/healthz")
        for i in range(edge_nodes):
            eport = 8081 + i
            start(f"edge node {i + 1}", [str(bindir / "edge-node"), "serve", "--model", str(art.edge_model),
                                         "--port", str(eport), "--parallel", "4", "--ctx", str(ctx["edge"]),
                                         "--gateway", f"http://127.0.0.1:{port}"],
                  f"http://127.0.0.1:{eport}/health")
        _wait_http(f"http://127.0.0.1:{port}/readyz", 30, procs[1][1], "gateway readiness")
        _wait_edge_registered(port, procs[1][1])
        console.print(f"""
[bold green]tiergate demo is up[/bold green] — gateway on http://127.0.0.1:{port}
  edge tier : {edge_nodes} llama.cpp node(s), model {art.edge_model.name} (INT4)
  cloud tier: [bold yellow]LOCAL STAND-IN[/bold yellow] (llama.cpp on :8090, not vLLM; see docs/cloud.md for real vLLM)
  cache     : in-memory semantic cache (ONNX MiniLM embedder)
Try:
  curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Authorization: Bearer tg-demo-key' \\
       -H 'Content-Type: application/json' -d '{{"model":"auto","messages":[{{"role":"user","content":"Hello!"}}]}}'
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
        for _, p in reversed(procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
