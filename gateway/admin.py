"""The operator's endpoints and the edge nodes' endpoints, and the two keys that guard them.

- `/admin/policy/reload`, `/admin/cache/invalidate`, `/admin/keys/{reload,revoke,unrevoke}` (and the status page,
  `gateway.status`) need the admin key
  (`TIERGATE_ADMIN_KEY`), checked by one `AdminKey`;
- `/edge/v1/heartbeat`, `/edge/v1/deregister` need the node's own key (`TIERGATE_EDGE_SECRET`), or the edge token
  (`TIERGATE_EDGE_TOKEN`) and the node's claim, or, without either setting, a node on this machine
  (`gateway.edge_auth`); a node id is refreshed or removed only by its owner, and the URL a node gives is checked
  (`gateway.pools.edge_urls`).

Tested in `tests/gateway/test_app_limits.py` and `tests/gateway/test_status.py`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tiergate.cache import SemanticCache
from tiergate.cache.store import StoreUnavailable
from tiergate.core.edge_identity import NODE_ID_PATTERN
from tiergate.core.errors import OpenAIError, bad_request, unauthorized
from tiergate.core.http import read_body
from tiergate.core.wire import decode_json
from tiergate.gateway.auth import hash_key
from tiergate.gateway.edge_auth import EdgeAuth, owned_conflict
from tiergate.gateway.keys import Keys
from tiergate.gateway.pools.edge import HeartbeatError, NodeOwned, parse_heartbeat
from tiergate.gateway.pools.edge_urls import UrlError, UrlPolicy
from tiergate.gateway.tiers import Tiers
from tiergate.policies.store import PolicyStore

__all__ = ["AdminEndpoints", "AdminKey", "EdgeEndpoints"]

_deregistration = msgspec.json.Decoder(dict[str, str | None])


class AdminKey:
    """The admin key, compared in constant time; no key configured means the admin surface is off."""

    def __init__(self, key: str | None) -> None:
        self._key = key or None

    @property
    def enabled(self) -> bool:
        return self._key is not None

    def matches(self, value: str | None) -> bool:
        """True when `value` is the key itself (`?key=` on the status page)."""
        return self._key is not None and value is not None and hmac.compare_digest(value.encode(), self._key.encode())

    def bearer(self, request: Request) -> bool:
        """True when the request carries `Authorization: Bearer <admin key>`."""
        got = request.headers.get("authorization", "")
        return self._key is not None and hmac.compare_digest(got.encode(), f"Bearer {self._key}".encode())

    def derived(self, purpose: bytes) -> str:
        """An HMAC of the key for `purpose` (a cookie value that is not the key itself)."""
        assert self._key is not None
        return hmac.new(self._key.encode(), purpose, "sha256").hexdigest()

    def require(self, request: Request) -> None:
        """Raise the OpenAI error for a request that may not use the admin surface: 403 when it is off, else 401."""
        if self._key is None:
            raise OpenAIError(403, "Admin endpoints are disabled: set TIERGATE_ADMIN_KEY.", type="permission_error",
                              code="admin_disabled")
        if not self.bearer(request):
            raise unauthorized("Invalid admin key.")


class AdminEndpoints:
    """Policy reload, cache invalidation and the tenants' keys (reload, revoke), for operators."""

    def __init__(self, key: AdminKey, policy_store: PolicyStore, cache: Callable[[], SemanticCache | None],
                 keys: Keys) -> None:
        self._key = key
        self._policy_store = policy_store
        self._cache = cache  # built at start-up, when enabled
        self._keys = keys

    async def reload_keys(self, request: Request) -> Response:
        self._key.require(request)
        if not self._keys.reloadable:
            raise OpenAIError(409, "No key file is configured (TIERGATE_API_KEYS_FILE): nothing to reload.",
                              code="no_key_file")
        error = await self._keys.reload()
        if error is not None:
            raise OpenAIError(422, error, code="keys_invalid")
        return JSONResponse({"ok": True, "keys": len(self._keys.ring), "tenants": len(self._keys.ring.tenants())})

    async def revoke_key(self, request: Request) -> Response:
        """`{"key": "..."}` or `{"sha256": "..."}`: refused from now on, on every replica within seconds."""
        self._key.require(request)
        await self._keys.revoke(await _key_digest(request))
        return JSONResponse({"ok": True})

    async def unrevoke_key(self, request: Request) -> Response:
        self._key.require(request)
        await self._keys.unrevoke(await _key_digest(request))
        return JSONResponse({"ok": True})

    async def reload(self, request: Request) -> Response:
        self._key.require(request)
        store = self._policy_store
        result = await store.reload()
        version = store.current.version
        if result.ok:
            return JSONResponse({"ok": True, "version": version, "error": None})
        # Rejected: the OpenAI error shape (what every client of this API parses) plus the version still serving.
        err = OpenAIError(422, result.error or "The policy file was rejected.", code="policy_invalid")
        return Response(msgspec.json.encode({**err.body(), "ok": False, "version": version}), status_code=422,
                        media_type="application/json")

    async def invalidate_cache(self, request: Request) -> Response:
        self._key.require(request)
        cache = self._cache()
        if cache is None:
            raise OpenAIError(409, "The cache is disabled.", code="cache_disabled")
        q = request.query_params
        for name in ("tenant", "entry"):
            if name in q and not q[name]:
                raise bad_request(f"`{name}` must not be empty.", param=name)
        if not (q.get("tenant") or q.get("entry") or q.get("all") == "true"):
            raise bad_request("Say what to invalidate: ?tenant=ID, ?entry=ID or ?all=true.")
        try:
            n = await cache.invalidate(tenant=q.get("tenant"), entry_id=q.get("entry"))
        except StoreUnavailable as exc:
            raise OpenAIError(503, f"The cache store is unreachable: {exc}", type="server_error",
                              code="cache_unavailable") from None
        return JSONResponse({"ok": True, "removed": n})


_key_request = msgspec.json.Decoder(dict[str, str])


async def _key_digest(request: Request) -> str:
    """The SHA-256 digest a key request names: `{"sha256": HEX}`, or `{"key": KEY}` (hashed here, never logged)."""
    usage = 'Send exactly one of {"key": "..."} or {"sha256": "<64 hex digits>"}.'
    try:
        body = decode_json(_key_request, await read_body(request, 4096))
    except (msgspec.ValidationError, msgspec.DecodeError):
        raise bad_request(usage) from None
    if set(body) == {"key"} and body["key"].strip():
        return hash_key(body["key"].strip())
    if set(body) != {"sha256"}:
        raise bad_request(usage)
    digest = body["sha256"].lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise bad_request(usage, param="sha256")
    return digest


class EdgeEndpoints:
    """Registration of edge nodes: heartbeats (which also register) and deregistration."""

    def __init__(self, auth: EdgeAuth, urls: UrlPolicy, max_body_bytes: int, tiers: Tiers) -> None:
        self._auth = auth
        self._urls = urls
        self._max_body_bytes = max_body_bytes
        self._tiers = tiers

    async def heartbeat(self, request: Request) -> Response:
        self._auth.precheck(request)
        try:
            info = parse_heartbeat(await read_body(request, self._max_body_bytes))
        except HeartbeatError as exc:
            raise bad_request(str(exc), code="invalid_heartbeat", param=exc.param) from None
        who = self._auth.identify(request, info.node_id)
        try:
            await self._urls.check(info.url, from_loopback=who.local)
        except UrlError as exc:
            raise bad_request(f"invalid heartbeat: {exc}", code="invalid_heartbeat", param="url") from None
        pool = self._tiers.edge_pool(info.tier)
        try:
            await pool.heartbeat(info, owner=who.owner, authoritative=who.authoritative)
        except HeartbeatError as exc:
            raise bad_request(str(exc), code="invalid_heartbeat", param=exc.param) from None
        except NodeOwned as exc:
            raise owned_conflict(str(exc)) from None
        return JSONResponse({"ok": True, "tier": pool.tier})

    async def deregister(self, request: Request) -> Response:
        self._auth.precheck(request)
        try:
            info = decode_json(_deregistration, await read_body(request, self._max_body_bytes))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise bad_request(f"deregister body must be {{\"node_id\": ...}}: {exc}", code="invalid_heartbeat") from None
        node_id = info.get("node_id")
        if not node_id or not NODE_ID_PATTERN.fullmatch(node_id):
            raise bad_request("deregister body needs `node_id`: 1-128 letters, digits and `._:-`.",
                              code="invalid_heartbeat", param="node_id")
        who = self._auth.identify(request, node_id)
        try:
            known = await self._tiers.edge_pool(info.get("tier")).deregister(
                node_id, owner=who.owner, authoritative=who.authoritative)
        except NodeOwned as exc:
            raise owned_conflict(str(exc)) from None
        return JSONResponse({"ok": True, "known": known})
