"""`POST /v1/cache/feedback`: a client reports that an answer it got from the cache was wrong.

    POST /v1/cache/feedback   Authorization: Bearer <the tenant's API key>
    {"request_id": "<the x-request-id of the answer>"}

The answer's entry is invalidated and, when it was a semantic hit, that entry's own threshold rises above the
similarity it was served at, and the error bound counts a wrong hit (`SemanticCache.feedback`). A request id
this tenant has no cache hit on record for (never a hit, older than `feedback_ttl_s`, another tenant's, or
unknown) is a 404 and changes nothing; reporting one twice changes nothing the second time.

The record of which entry answered which request is written after a hit's response has gone out
(`Relay.cached` schedules `SemanticCache.served`).

Tested in `tests/integration/test_cache_gateway.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tiergate.cache import SemanticCache
from tiergate.cache.store import StoreUnavailable
from tiergate.core.errors import OpenAIError, bad_request, not_found
from tiergate.core.http import read_body
from tiergate.gateway.auth import Authenticator

__all__ = ["CacheFeedback"]

_MAX_ID = 256


class _Body(msgspec.Struct, forbid_unknown_fields=False):
    request_id: str


class CacheFeedback:
    def __init__(self, keyring: Authenticator, cache: Callable[[], SemanticCache | None]) -> None:
        self._keyring = keyring
        self._cache = cache  # built at start-up, when enabled

    async def handle(self, request: Request) -> Response:
        tenant = self._keyring.authenticate(request.headers.get("authorization"))
        try:
            body = msgspec.json.decode(await read_body(request, 16_384), type=_Body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise bad_request(f"Expected {{\"request_id\": \"...\"}}: {exc}", param="request_id") from None
        rid = body.request_id
        if not rid or len(rid) > _MAX_ID:
            raise bad_request(f"`request_id` must be 1 to {_MAX_ID} characters.", param="request_id")
        cache = self._cache()
        if cache is None:
            raise OpenAIError(409, "The cache is disabled.", code="cache_disabled")
        try:
            result = await cache.feedback(tenant.id, rid)
        except StoreUnavailable as exc:
            raise OpenAIError(503, f"The cache store is unreachable: {exc}", type="server_error",
                              code="cache_unavailable") from None
        if result is None:
            raise not_found("No cache hit with this request id for your key (unknown, expired, or not a cache "
                            "hit).", code="unknown_request_id", param="request_id")
        return JSONResponse({"ok": True, "request_id": rid, "entry": result.entry_id, "kind": result.kind,
                             "invalidated": result.removed, "entry_threshold": result.threshold,
                             "already_reported": result.already_reported})
