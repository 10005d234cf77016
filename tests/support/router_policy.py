"""The policy the learned-router tests share: an edge and a cloud tier (unreachable: the tests answer for them), a
rule that sends what the router predicts will fail on the edge to the cloud, and a cascade rule; each test module
gives its own `router:` section."""

from __future__ import annotations

_TIERS = """\
version: 1
tiers:
  edge: {kind: edge, model: tiergate-edge, endpoints: ["http://127.0.0.1:9"]}
  cloud: {kind: cloud, model: tiergate-cloud, endpoints: ["http://127.0.0.1:9"]}
"""
_RULES = """\
rules:
  - name: predicted-failure
    when: {edge_success: {max: 0.2}}
    tier: cloud
  - name: cascade
    tier: edge
    fallbacks: [cloud]
    cascade: {min_mean_logprob: -1.0}
"""


def router_policy(router: str) -> str:
    """The policy's YAML with `router: <router>` (a flow mapping) between its tiers and its rules."""
    return f"{_TIERS}router: {router}\n{_RULES}"
