"""The targets bench/overhead puts between the client and the instant upstream, each a process started here.

- `direct`: no hop (the upstream itself), the reference every added latency is measured against.
- `passthrough`: uvicorn + Starlette + one aiohttp client relaying bytes: the floor of any Python gateway here.
- `tiergate`: `tiergate serve`, the exact cache on (every prompt is new: a miss plus a store), no embedder.
- `tiergate@REV`: the same from another checkout (`--baseline-tree`), e.g. the commit before a restructuring.
- `tiergate+semantic`: the semantic cache on (the ONNX embedder from `tiergate prepare`): every request is a miss
  that embeds its prompt, the slow path of a cache-enabled gateway.
- `tiergate+router`: the learned router on: a `router` section, a model for the edge's version and an
  `edge_success` rule, so every request computes the router's features and one prediction before the decision.
- `tiergate-2w`: two uvicorn workers (`TIERGATE_WORKERS=2`), each a full gateway, allowed on both cores.
- `litellm`: LiteLLM's proxy at bench/versions.py's pin, one worker.
Servers under test run on CPU 0 (2-worker tiergate on both), the upstream and the load generators on CPU 1.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.procs import Server, free_port
from tiergate.complexity.edge_router import DENSE, HASH_BUCKETS, RouterArtifact, RouterModel

__all__ = ["KEY", "Target", "litellm_target", "make_targets"]

KEY = "tg-bench-key"

POLICY = """\
# Bench policy: one edge tier whose only endpoint is the instant upstream.
version: 1
{defaults}tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: ["http://127.0.0.1:{port}"]
rules:
{rules}  - name: everything-to-edge
    tier: edge
"""


# The `costs` variant: the bench tenant under a budget it never reaches, so each request reserves its worst case,
# is priced at settlement, recorded in the (in-process) spend ledger and split into savings.
COSTS = """\
costs:
  currency: USD
  reference_tier: edge
  prices:
    edge: {prompt_per_1k: 0.01, completion_per_1k: 0.03}
budgets:
  tenants:
    bench: {period: month, hard: 1000000000}
"""


# The `router` variant: an `edge_success` rule that never holds (max 0: no request leaves the path the others take)
# but that makes every request predict; exploration and recording off (there is no cascade to judge anyway).
ROUTER = "router: {{model: {model}, explore: 0.0, record: false}}\n"
ROUTER_RULE = """\
  - name: predicted-failure
    when: {edge_success: {max: 0.0}}
    tier: edge
"""


def router_artifact(path: Path) -> Path:
    """A router model for every name the edge version may have here (the tier's model, the upstream's): random
    weights, as a prediction costs the same whatever its weights (features, a dot product, a sigmoid)."""
    rng = np.random.default_rng(0)
    models = {v: RouterModel(v, rng.normal(0, 0.3, DENSE + HASH_BUCKETS), -0.5, 1.0, 0.0)
              for v in ("tiergate-edge", "instant")}
    RouterArtifact(models).save(path)
    return path


@dataclass
class Target:
    name: str
    base: str
    model: str
    server: Server | None = None  # None: not ours to start (direct)
    note: str = ""
    results: dict = field(default_factory=dict)


def _git_rev(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or tree.name


def _tiergate(name: str, py: str, tmp: Path, up_port: int, *, cpus: set[int], env: dict[str, str] | None = None,
              defaults: str = "", rules: str = "", command: list[str] | None = None) -> Target:
    port = free_port()
    policy = tmp / f"policy-{name}.yaml"
    policy.write_text(POLICY.format(port=up_port, defaults=defaults, rules=rules))
    server = Server(name, [*(command or [str(Path(py).parent / "tiergate")]), "serve", "--port", str(port)],
                    f"http://127.0.0.1:{port}/readyz", cpus=cpus, log=tmp / f"{name}.log",
                    env={"TIERGATE_POLICY": str(policy), "TIERGATE_API_KEYS": f"{KEY}=bench",
                         "TIERGATE_LOG_LEVEL": "warning", "TIERGATE_EMBEDDER": ""} | (env or {}))
    return Target(name, f"http://127.0.0.1:{port}", "auto", server)


def make_targets(args, py: str, tmp: Path, up_port: int, embedder: Path | None) -> list[Target]:
    """Every target this run measures, not yet started, in table order (LiteLLM last: see bench.anchors)."""
    pt_port = free_port()
    out = [Target("direct", f"http://127.0.0.1:{up_port}", "instant"),
           Target("passthrough", f"http://127.0.0.1:{pt_port}", "instant",
                  Server("passthrough", [py, "-m", "bench.overhead.passthrough", "--port", str(pt_port), "--upstream",
                                         f"http://127.0.0.1:{up_port}"], f"http://127.0.0.1:{pt_port}/health",
                         cpus={0}, log=tmp / "passthrough.log")),
           _tiergate("tiergate", py, tmp, up_port, cpus={0})]
    for tree in (Path(t).resolve() for t in args.baseline_tree):
        pp = os.pathsep.join([str(tree), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
        # A checkout from before the `tiergate.` namespace has no tiergate/ links: start its CLI by its old name,
        # with its tree first on sys.path (the console script would import this checkout's code through the
        # editable install, and `-m` would find this working directory's gateway/ first).
        old = not (tree / "tiergate").is_dir()
        boot = f"import sys; sys.path.insert(0, {str(tree)!r}); from gateway.cli import app; app()"
        t = _tiergate(f"tiergate@{_git_rev(tree)}", py, tmp, up_port, cpus={0}, env={"PYTHONPATH": pp},
                      command=[py, "-c", boot] if old else None)
        t.note = f"the gateway from {tree}"
        out.append(t)
    if "semantic" in args.variants:
        if embedder is None:
            print("  (skipping tiergate+semantic: no embedder; run `tiergate prepare`)")
        else:
            out.append(_tiergate("tiergate+semantic", py, tmp, up_port, cpus={0},
                                 env={"TIERGATE_EMBEDDER": str(embedder)},
                                 defaults="defaults:\n  cache: {enabled: true, semantic: true}\n"))
    if "costs" in args.variants:  # every answer priced, recorded in the spend ledger and settled from a budget
        out.append(_tiergate("tiergate+costs", py, tmp, up_port, cpus={0}, defaults=COSTS))
    if "router" in args.variants:  # the router's features and one prediction before every decision
        model = router_artifact(tmp / "edge-router.json")
        out.append(_tiergate("tiergate+router", py, tmp, up_port, cpus={0}, defaults=ROUTER.format(model=model),
                             rules=ROUTER_RULE))
    if "2w" in args.variants:
        out.append(_tiergate("tiergate-2w", py, tmp, up_port, cpus={0, 1}, env={"TIERGATE_WORKERS": "2"}))
    return out


def litellm_target(bin_dir: Path, tmp: Path, up_port: int) -> Target:
    port = free_port()
    cfg = tmp / "litellm.yaml"
    cfg.write_text(f"model_list:\n  - model_name: instant\n    litellm_params:\n      model: openai/instant\n"
                   f"      api_base: http://127.0.0.1:{up_port}/v1\n      api_key: x\n"
                   f"general_settings:\n  master_key: {KEY}\nlitellm_settings:\n  telemetry: false\n")
    server = Server("litellm", [str(bin_dir / "litellm"), "--config", str(cfg), "--port", str(port),
                                "--num_workers", "1"], f"http://127.0.0.1:{port}/health/liveliness", cpus={0},
                    log=tmp / "litellm.log", env={"LITELLM_LOG": "ERROR", "LITELLM_TELEMETRY": "False"})
    return Target("litellm", f"http://127.0.0.1:{port}", "instant", server)
