"""The edge node's API key: every request but `GET /health` must carry `Authorization: Bearer <key>`.

With keys configured (`edge-node serve --node-key` derives one, `--api-key` adds one) the OpenAI routes, `/metrics`
and the test hooks answer 401 in the OpenAI format without one of them; `/health` stays open for load balancers,
container health checks and the gateway's liveness polls (it carries no prompt, only the node's id, model and load).
The gateway presents the key on every request it sends the node (`gateway.pools.access`). With no key the node is
open, which `edge-node serve` allows on a loopback bind address only.

Keys are kept as SHA-256 digests and compared in constant time. Tested in `tests/edge_node/server/test_auth.py`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from tiergate.core.errors import unauthorized
from tiergate.core.http import error_response

__all__ = ["OPEN_PATHS", "ApiKeyMiddleware"]

OPEN_PATHS = frozenset({"/health"})


class ApiKeyMiddleware:
    """Pure ASGI middleware: HTTP requests outside `OPEN_PATHS` need one of `keys` as a bearer token."""

    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self.app = app
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._digests or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        scheme, _, given = Headers(scope=scope).get("authorization", "").partition(" ")
        digest = hashlib.sha256(given.strip().encode()).digest()
        ok = False
        for known in self._digests:  # every key compared: no timing difference between them
            ok |= hmac.compare_digest(digest, known)
        if scheme.lower() == "bearer" and ok:
            await self.app(scope, receive, send)
            return
        why = "Missing API key" if not given else "Invalid API key"
        response = error_response(unauthorized(f"{why}: this edge node requires `Authorization: Bearer <key>` (the "
                                               f"gateway presents it; see edge-node serve --node-key / --api-key)."),
                                  headers={"www-authenticate": "Bearer"})
        await response(scope, receive, send)
