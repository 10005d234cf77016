"""What an edge node and the gateway agree on about the node's identity: its id, its key, its API key, its claim.

**Per-node keys, derived from one gateway secret.** An operator gives the gateway one secret
(`TIERGATE_EDGE_SECRET`) and each node the key of its id, `node_key(secret, node_id)` (`tiergate edge node-key ID`
prints it; any machine with `openssl` can compute it, see docs/reliability.md "Threat model"). A node proves who it
is by presenting that key with its heartbeats; the gateway recomputes it from the id in the heartbeat. Chosen over a
file of per-node key digests on every gateway replica because:

- every replica checks a node with nothing but the secret: no per-node file to distribute, reload and keep in step
  across replicas, and ownership of an id holds on every replica at once (the key *is* the id's ownership, so a
  registration in the shared Redis registry can be refreshed, replaced or removed only with it);
- adding a node needs no change on the gateway, only its key on the node;
- one node's key, if stolen, names only that node: it cannot register, refresh or remove any other id.

The price is revocation: one node's key cannot be withdrawn alone, the secret is rotated (every node gets its new
key). A fleet that needs per-node revocation without a rotation would want the file instead.

**The node's API key is derived from its node key** (`node_api_key`), and the gateway, which can derive it too,
presents it on every request it sends to the node. The two are different on purpose: the API key travels to the
node with every completion, the node key only to the gateway; whoever reads the node's API traffic can use that
node's API, but cannot take its registration.

**A claim** (`CLAIM_HEADER`) is a random value an edge node makes up when it starts and sends with every heartbeat
and its deregistration. Where no per-node key is used (the shared `TIERGATE_EDGE_TOKEN`, or a gateway accepting
loopback nodes without one), the first heartbeat of a node id binds it to its claim: until that registration ends
(deregistered, or silent past its TTL) only the same claim refreshes or removes it.

Tested in `tests/core/test_edge_identity.py`.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

__all__ = ["CLAIM_HEADER", "CLAIM_PATTERN", "NODE_ID_PATTERN", "is_loopback", "node_api_key", "node_key"]

CLAIM_HEADER = "x-tiergate-node-claim"
CLAIM_PATTERN = re.compile(r"[!-~]{16,256}")  # printable ASCII, no spaces
# Ids go into logs, Redis keys and the status page: letters, digits and `._:-`, starting with a letter or digit.
NODE_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

_NODE_KEY_CONTEXT = b"tiergate-edge-node:"
_API_KEY_CONTEXT = b"tiergate-edge-api"


def node_key(secret: str, node_id: str) -> str:
    """The key of edge node `node_id` under the gateway secret: hex HMAC-SHA256(secret, "tiergate-edge-node:" + id).

    Same as `printf 'tiergate-edge-node:%s' ID | openssl dgst -sha256 -hmac SECRET`."""
    return hmac.new(secret.encode(), _NODE_KEY_CONTEXT + node_id.encode(), hashlib.sha256).hexdigest()


def node_api_key(key: str) -> str:
    """The key a node's API requires and the gateway presents: hex HMAC-SHA256(node key, "tiergate-edge-api")."""
    return hmac.new(key.encode(), _API_KEY_CONTEXT, hashlib.sha256).hexdigest()


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1, ::ffff:127.x); false for 0.0.0.0, ::, any other
    address or name (a name may resolve anywhere)."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback
