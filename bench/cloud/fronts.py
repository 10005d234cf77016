"""The routers bench/cloud compares, each an HTTP front end over the same vLLM servers.

- tiergate: a `tiergate serve` per row whose policy has that row's one cloud tier over the servers, as a
  deployment would have it (one pool polling each server), so every row goes through the gateway's real path
  (auth, policy, `CloudPool.candidates()`, dispatch, the SSE relay). Rows: `tiergate-prefix` (prefix affinity
  with the defaults: load bound 1.2, 1.8 for a server the prefix memory says holds the prompt),
  `tiergate-prefix-no-memory` (cached_load_bound = load_bound: the rule before the prefix memory, whose only
  effect left is the order of the holders), `tiergate-prefix-1.5`, and the oracle, `unbounded-affinity`: the
  same rendezvous ranking with the bound at its maximum (10), which on these pool sizes never spills, so every
  prefix always lands on its own server however loaded.
- vllm-router (the vLLM project's Rust router, pinned in bench/versions.py, its own virtualenv): `--policy
  cache_aware` (its approximate radix tree of the prompts each worker has seen, balancing only past its
  thresholds) and `--policy round_robin`.
Every front end is started for its row and stopped after it, so none carries state from another row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.anchors import ensure_vllm_router
from bench.procs import Server, free_port

__all__ = ["ROWS", "Front", "gateway", "vllm_router"]

KEY = "tg-bench-cloud"


@dataclass(frozen=True)
class Front:
    row: str
    kind: str  # "tiergate" | "vllm-router"
    model: str  # what the request names
    detail: str


# row -> how it is served. The tiergate rows share one gateway; each vllm-router policy is its own process.
ROWS = {
    "round-robin": Front("round-robin", "vllm-router", "", "vllm-router --policy round_robin"),
    "vllm-router-cache-aware": Front("vllm-router-cache-aware", "vllm-router", "",
                                     "vllm-router --policy cache_aware (defaults)"),
    "tiergate-prefix": Front("tiergate-prefix", "tiergate", "cloud-prefix",
                             "prefix, load_bound 1.2, cached_load_bound 1.8 (defaults)"),
    "tiergate-prefix-no-memory": Front("tiergate-prefix-no-memory", "tiergate", "cloud-prefix-flat",
                                       "prefix, load_bound 1.2, cached_load_bound 1.2 (no cached allowance)"),
    "tiergate-prefix-1.5": Front("tiergate-prefix-1.5", "tiergate", "cloud-prefix-15", "prefix, load_bound 1.5"),
    "unbounded-affinity": Front("unbounded-affinity", "tiergate", "cloud-oracle",
                                "oracle: prefix, load_bound 10 (never spills)"),
    "tiergate-round-robin": Front("tiergate-round-robin", "tiergate", "cloud-rr", "tiergate round_robin"),
}
# model -> (strategy, load_bound, cached_load_bound or None for the default)
_TIERS = {"cloud-prefix": ("prefix", 1.2, None), "cloud-prefix-flat": ("prefix", 1.2, 1.2),
          "cloud-prefix-15": ("prefix", 1.5, None), "cloud-oracle": ("prefix", 10.0, None),
          "cloud-rr": ("round_robin", 1.2, None)}


def _tier(model: str) -> str:
    return model.removeprefix("cloud-")


def _policy(urls: list[str], served: str, max_num_seqs: int, models: list[str] | None = None) -> str:
    eps = ", ".join(f'"{u}"' for u in urls)
    tiers = {m: _TIERS[m] for m in (models or list(_TIERS))}
    lines = ["version: 1", "defaults:", "  cache: {enabled: false}", "tiers:"]
    for model, (strategy, bound, cached) in tiers.items():
        extra = f", cached_load_bound: {cached}" if cached is not None else ""
        lines += [f"  {_tier(model)}:", "    kind: cloud", f"    model: {model}",
                  f"    served_model: {served}", f"    endpoints: [{eps}]",
                  f"    routing: {{strategy: {strategy}, load_bound: {bound}{extra}, max_num_seqs: {max_num_seqs}}}"]
    lines.append("rules:")
    for model in tiers:
        lines += [f"  - name: to-{model}", f"    when: {{model: {model}}}", f"    tier: {_tier(model)}"]
    lines.append(f"default_tier: {_tier(next(iter(tiers)))}")
    return "\n".join(lines) + "\n"


def gateway(urls: list[str], served: str, max_num_seqs: int, tmp: Path, python: str, model: str) -> Server:
    """`tiergate serve` with one cloud tier (the row's, by the model it serves) over the servers, not started;
    exact and semantic caches off."""
    policy = tmp / f"cloud-policy-{model}.yaml"
    policy.write_text(_policy(urls, served, max_num_seqs, [model]))
    port = free_port()
    tiergate = str(Path(python).parent / "tiergate")
    return Server("tiergate", [tiergate, "serve", "--port", str(port)], f"http://127.0.0.1:{port}/readyz",
                  env={"TIERGATE_POLICY": str(policy), "TIERGATE_API_KEYS": f"{KEY}=bench",
                       "TIERGATE_LOG_LEVEL": "warning", "TIERGATE_EMBEDDER": ""}, log=tmp / f"gateway-{model}.log")


def vllm_router(urls: list[str], policy: str, tmp: Path) -> Server:
    """vllm-router with one policy over the servers (not started)."""
    bin_dir = ensure_vllm_router()
    port = free_port()
    return Server(f"vllm-router-{policy}",
                  [str(bin_dir / "python"), "-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--port",
                   str(port), "--worker-urls", *urls, "--policy", policy, "--log-level", "warning"],
                  f"http://127.0.0.1:{port}/health", log=tmp / f"vllm-router-{policy}.log")
