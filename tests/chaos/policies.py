"""The policies the chaos tests run: one shape each for the edge and the cloud scenarios, the timeouts per test
(a stopped backend's test gives requests far longer than its clients wait, so only the failover answers in time;
a killed backend's test keeps them short)."""

from __future__ import annotations

from pathlib import Path

from tests.support.vllm import MODEL_NAME

__all__ = ["cloud_only", "edge_then_cloud"]


def edge_then_cloud(path: Path, cloud_url: str, tokenizer: Path, *, first_byte_s: float, total_s: float) -> Path:
    """Edge first (nodes register by heartbeat), the cloud URL as its fallback; no cache."""
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: {first_byte_s}, between_chunks_s: 10, total_s: {total_s}, queue_s: 10}}
  cache: {{enabled: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    tokenizer: {tokenizer}
    max_context: 1024
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: ["{cloud_url}"]
rules:
  - name: default
    tier: edge
    fallbacks: [cloud]
""")
    return path


def cloud_only(path: Path, urls: list[str], *, first_byte_s: float, total_s: float, queue_s: float) -> Path:
    """One cloud tier over the given vLLM servers; no cache."""
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: {first_byte_s}, between_chunks_s: 20, total_s: {total_s}, queue_s: {queue_s}}}
  cache: {{enabled: false}}
tiers:
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: {MODEL_NAME}
    endpoints: {urls!r}
    max_context: 256
rules:
  - name: default
    tier: cloud
""".replace("'", '"'))
    return path
