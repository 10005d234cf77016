"""How the gateway reaches a tier's backends: the API key it presents and the CAs it verifies their TLS with.

- A node registered with its own key (`gateway.edge_auth`) is sent its own API key, derived from that key
  (`core.edge_identity.node_api_key`): per node, so a node only ever learns its own.
- Every other backend of a tier (static endpoints, vLLM servers, nodes registered with the shared token) is sent
  the tier's key: the environment variable the policy names in the tier's `api_key_env` (vLLM's `--api-key` /
  `VLLM_API_KEY`, an edge node's `--api-key`).
- `https://` backends are verified against `TIERGATE_BACKEND_CA_FILE` (else the system's CAs).

The headers go on each `Endpoint` (`Endpoint.headers`), which the upstream client and the pools' health checks send.
Tested in `tests/gateway/pools/test_access.py`.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import structlog

from tiergate.core.edge_identity import node_api_key, node_key
from tiergate.gateway.pools.edge_registry import NODE_KEY_OWNER

__all__ = ["NODE_KEY_OWNER", "BackendAccess", "tier_headers"]

log = structlog.get_logger("tiergate.gateway")

@dataclass(frozen=True, slots=True)
class BackendAccess:
    """What one tier's pool sends its backends: `headers` (the tier's key), per-node keys; `tls` verifies them."""

    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    tls: ssl.SSLContext | None = None  # None: aiohttp's default verification (the system's CAs)
    edge_secret: str | None = field(default=None, repr=False)

    def node_headers(self, node_id: str, owner: str) -> Mapping[str, str]:
        """What a registered node is sent: its own API key when it registered with its node key, else the tier's."""
        if self.edge_secret and owner == NODE_KEY_OWNER:
            return {"authorization": f"Bearer {node_api_key(node_key(self.edge_secret, node_id))}"}
        return self.headers

    @property
    def connector_ssl(self) -> ssl.SSLContext | bool:
        """aiohttp's `ssl` argument: the context, or True (verify with the system's CAs)."""
        return self.tls if self.tls is not None else True


def tier_headers(tier: str, api_key_env: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The `Authorization` header of a tier's key, read from the environment variable its policy names."""
    if not api_key_env:
        return {}
    key = environ.get(api_key_env, "").strip()
    if not key:
        log.error("tier_api_key_unset", tier=tier, api_key_env=api_key_env,
                  message=f"tier `{tier}` names api_key_env {api_key_env} but it is unset or empty: its backends "
                          f"will refuse the gateway (401)")
        return {}
    return {"authorization": f"Bearer {key}"}
