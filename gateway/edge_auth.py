"""Who may register, refresh and remove an edge node: the checks behind `/edge/v1/heartbeat` and `/edge/v1/deregister`.

Three ways a node is let in, strongest first (docs/reliability.md, "Threat model"):

1. **Its own key** (`TIERGATE_EDGE_SECRET` set): `Authorization: Bearer <node key>`, where the node key is derived
   from the gateway secret and the node id in the body (`core.edge_identity.node_key`). The key names one id: the
   registration is owned by that key (`NODE_KEY_OWNER`), on every replica, and no other credential can refresh,
   replace or remove it (`authoritative`: it also takes back an id someone registered with the shared token).
2. **The shared token** (`TIERGATE_EDGE_TOKEN`): `Authorization: Bearer <token>` plus the node's claim
   (`CLAIM_HEADER`, a random value the node makes up at start). The token lets a node register an id no live
   registration holds; the registration is then owned by its claim, and a token holder with another claim cannot
   refresh, replace or remove it. With both settings, the token still works this way (for nodes not yet given
   their key); unset it once every node has one.
3. **Neither set**: only a process on this machine may register, with its claim as in 2: the request must come
   from a loopback socket and carry no proxy header (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`, ...). The peer
   is the ASGI scope's `client`, which is the socket's own address because `tiergate serve` runs uvicorn without
   proxy-header rewriting (`proxy_headers=False`); a request relayed by a local reverse proxy carries the proxy's
   headers and is refused, whatever the address.

Tested in `tests/gateway/test_edge_auth.py`.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from starlette.requests import Request

from tiergate.core.edge_identity import CLAIM_HEADER, CLAIM_PATTERN, is_loopback, node_key
from tiergate.core.errors import OpenAIError, bad_request, unauthorized
from tiergate.gateway.pools.edge_registry import NODE_KEY_OWNER

__all__ = ["FORWARDING_HEADERS", "EdgeAuth", "Registrant", "from_this_machine", "owned_conflict", "socket_peer"]

# Headers a proxy adds to say whom it relays for: present, the request did not come from the socket's own peer.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip",
                      "x-client-ip", "true-client-ip", "cf-connecting-ip")


@dataclass(frozen=True, slots=True)
class Registrant:
    """Who sent a heartbeat or deregistration, once checked: the owner its registration gets, whether its
    credentials name the node id itself (its own key), and whether it came from this machine."""

    owner: str
    authoritative: bool
    local: bool


def socket_peer(request: Request) -> str | None:
    """The address of the socket's peer, from the ASGI scope (None: no client, e.g. a Unix socket)."""
    client = request.scope.get("client")
    return str(client[0]) if client else None


def from_this_machine(request: Request) -> bool:
    """A loopback socket peer, and no header saying the request was relayed for someone else."""
    peer = socket_peer(request)
    if peer is None or not is_loopback(peer) or peer == "localhost":  # a socket's peer is an address
        return False
    return not any(name in request.headers for name in FORWARDING_HEADERS)


class EdgeAuth:
    """The registration credentials a gateway accepts: per-node keys (`secret`), the shared `token`, or neither."""

    def __init__(self, secret: str | None, token: str | None) -> None:
        self._secret = secret or None
        self._token = token or None

    def precheck(self, request: Request) -> None:
        """Before reading the body: 401 for a request that cannot be let in whatever its body says."""
        if self._secret is None and self._token is None:
            if not from_this_machine(request):
                raise unauthorized("Edge registration from other machines (or through a proxy) needs credentials: "
                                   "set TIERGATE_EDGE_SECRET (per-node keys) or TIERGATE_EDGE_TOKEN on the gateway.")
            return
        if not _bearer(request):
            raise unauthorized("Missing edge credentials: send `Authorization: Bearer <node key>` (or the edge "
                               "token with the node's claim).")

    def identify(self, request: Request, node_id: str) -> Registrant:
        """Who is asking to register, refresh or remove `node_id`: 401 for wrong credentials, 400 without a claim
        where one is needed."""
        self.precheck(request)
        local = from_this_machine(request)
        given = _bearer(request)
        if self._secret is not None and hmac.compare_digest(given.encode(), node_key(self._secret, node_id).encode()):
            return Registrant(NODE_KEY_OWNER, authoritative=True, local=local)
        if self._token is not None:
            if not hmac.compare_digest(given.encode(), self._token.encode()):
                raise unauthorized(f"Invalid credentials for edge node `{node_id}`: neither its node key "
                                   f"(`tiergate edge node-key {node_id}`) nor the edge token."
                                   if self._secret is not None else "Invalid edge token.")
        elif self._secret is not None:
            raise unauthorized(f"Invalid node key for edge node `{node_id}`: a node presents the key of its own id "
                               f"(`tiergate edge node-key {node_id}` on a machine holding TIERGATE_EDGE_SECRET).")
        return Registrant(_claim_owner(request), authoritative=False, local=local)


def _bearer(request: Request) -> str:
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""


def _claim_owner(request: Request) -> str:
    claim = request.headers.get(CLAIM_HEADER, "")
    if not CLAIM_PATTERN.fullmatch(claim):
        raise bad_request(f"A node registering without its own key must send `{CLAIM_HEADER}`: a random value of "
                          f"16-256 printable characters it keeps for its life (edge-node serve does), which binds the "
                          f"node id to it.", code="invalid_heartbeat", param=CLAIM_HEADER)
    return "claim:" + hashlib.sha256(claim.encode()).hexdigest()


def owned_conflict(message: str) -> OpenAIError:
    """The 409 for a node id another node holds."""
    return OpenAIError(409, message, code="node_id_taken", param="node_id")
