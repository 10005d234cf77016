"""`POST /v1/embeddings`, served by the gateway itself with the cache's own embedder (onnxruntime, no torch).

The semantic cache already loads a sentence embedder (TIERGATE_EMBEDDER, all-MiniLM-L6-v2 by default) in every
gateway process; serving it costs no other process and no GPU, and its vectors are the ones the cache matches
on. It is offered under the name TIERGATE_EMBEDDINGS_MODEL while the cache has an embedder, never otherwise.
What it cannot honour is refused, not approximated: a text longer than the model's window (its end would be
dropped: 400 `context_length_exceeded`), `dimensions` other than the model's own (the model was not trained to be
cut), token-id input. Requests are admitted, rate-limited and token-reserved like completions, with the input's
real token count (the model's tokenizer, special tokens included), which `usage` reports.

They are priced at the policy's `costs.embeddings_per_1k` (the embedder's CPU) and spent like answers: the exact
cost, known from the token count before any work, is reserved from the key's and tenant's budgets (a 429 when
they are spent), recorded in the spend ledger (so `/v1/usage` counts it) and `tiergate_spend_total` (tier and rule
`embeddings`), and quoted in `x-tiergate-cost`. They save nothing (`gateway.savings`).

Tested in `tests/gateway/test_embeddings.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable

import msgspec
import numpy as np
import structlog
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tiergate.cache.embedder import OnnxEmbedder
from tiergate.core.errors import OpenAIError, bad_request, from_validation, not_found
from tiergate.core.http import error_response, read_body
from tiergate.core.wire import decode_json
from tiergate.gateway.auth import Authenticator
from tiergate.gateway.budgets import Budgets, Hold
from tiergate.gateway.context import safe_request_id
from tiergate.gateway.limits import Limiter
from tiergate.gateway.metrics import GatewayMetrics
from tiergate.gateway.savings import SavingSource, count_saving
from tiergate.gateway.settings import Settings
from tiergate.gateway.settlement import CacheProvider
from tiergate.policies.costs import format_cost
from tiergate.policies.model import Policy

__all__ = ["EmbeddingRequest", "Embeddings"]

log = structlog.get_logger("tiergate.gateway")
TIER = "embeddings"  # the metrics' tier label of these requests


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    """OpenAI's embeddings request; `input` is text (token ids are refused with a 400 naming them)."""

    model: str
    input: str | list[str]
    encoding_format: str = "float"
    dimensions: int | None = None
    user: str | None = None


_decoder = msgspec.json.Decoder(EmbeddingRequest)
_ANY: msgspec.json.Decoder[object] = msgspec.json.Decoder()


class Embeddings:
    """The endpoint; the embedder is read through the cache at each request (start-up builds the cache)."""

    def __init__(self, settings: Settings, keyring: Authenticator, limiter: Limiter, metrics: GatewayMetrics,
                 cache: CacheProvider, budgets: Budgets, policy: Callable[[], Policy]) -> None:
        self._settings, self._keyring, self._limiter, self._metrics, self._cache = (settings, keyring, limiter,
                                                                                    metrics, cache)
        self._budgets, self._policy = budgets, policy

    def embedder(self) -> OnnxEmbedder | None:
        """The embedder served, or None while the cache has none (disabled, exact-only or not started)."""
        cache = self._cache()
        batcher = cache.batcher if cache is not None else None
        return batcher.embedder if batcher is not None else None

    def model_card(self, created: int) -> dict[str, object] | None:
        """Its `/v1/models` entry, or None while there is no embedder."""
        embedder = self.embedder()
        if embedder is None:
            return None
        return {"id": self._settings.embeddings_model, "object": "model", "created": created, "owned_by": "tiergate",
                "kind": "embedding", "dimensions": embedder.dim, "max_input_tokens": embedder.max_length,
                "description": "The semantic cache's sentence embedder (onnxruntime in the gateway)."}

    async def handle(self, request: Request) -> Response:
        started = time.perf_counter()
        rid = safe_request_id(request.headers.get("x-request-id"))
        tenant_id = None
        try:
            tenant, key = self._keyring.identify(request.headers.get("authorization"))
            tenant_id = tenant.id
            body = await read_body(request, self._settings.max_body_bytes, self._settings.body_timeout_s)
            req = self._parse(body)
            embedder = self.embedder()
            if req.model != self._settings.embeddings_model or embedder is None:
                served = (f"The embedding model is `{self._settings.embeddings_model}`." if embedder is not None
                          else "No embedding model is served: the cache has no embedder (TIERGATE_EMBEDDER, "
                               "TIERGATE_CACHE).")
                raise not_found(f"The model `{req.model}` does not exist. {served}", code="model_not_found",
                                param="model")
            if req.dimensions is not None and req.dimensions != embedder.dim:
                raise bad_request(f"`dimensions` must be omitted or {embedder.dim}: the model's vectors are "
                                  f"{embedder.dim}-dimensional and it was not trained to be shortened.",
                                  param="dimensions")
            texts = [req.input] if isinstance(req.input, str) else req.input
            slot = await self._limiter.admit(tenant)
            try:
                counts = await asyncio.to_thread(embedder.window_counts, texts)
                for i, count in enumerate(counts):
                    if count is None:
                        where = "`input`" if isinstance(req.input, str) else f"`input[{i}]`"
                        raise bad_request(f"{where} is longer than the model's window of {embedder.max_length} "
                                          f"tokens; split it.", code="context_length_exceeded", param="input")
                tokens = sum(c or 0 for c in counts)
                reservation = await self._limiter.reserve(tenant, tokens)
                policy = self._policy()
                cost = policy.costs.embedding(tokens) if policy.costs is not None else None
                hold = None
                if cost is not None:
                    try:
                        hold, _ = await self._budgets.reserve(policy, tenant.id, key, cost)
                    except OpenAIError:  # over budget: it used none of the token window it reserved
                        if reservation is not None:
                            await self._limiter.settle(reservation, 0)
                        raise
                cache = self._cache()
                assert cache is not None and cache.batcher is not None  # embedder() found them
                try:
                    vectors = await cache.batcher.embed_many(texts)
                except BaseException:
                    await self._settle(policy, tenant.id, key, hold, None, 0)  # nothing done: the hold goes back
                    raise
                await self._settle(policy, tenant.id, key, hold, cost, tokens)
                if reservation is not None:
                    await self._limiter.settle(reservation, tokens)
            finally:
                slot.release()
        except OpenAIError as exc:
            log.info("embeddings_refused", request_id=rid, tenant=tenant_id, status=exc.status, code=exc.code)
            self._metrics.child(self._metrics.requests, TIER, "none", "none", "bypass", str(exc.status)).inc()
            return error_response(exc, {"x-request-id": rid})
        except ClientDisconnect:
            return Response(status_code=499)
        data = [{"object": "embedding", "index": i, "embedding": _encoded(v.values, req.encoding_format)}
                for i, v in enumerate(vectors)]
        self._metrics.tokens.labels(TIER, "prompt").inc(tokens)
        self._metrics.child(self._metrics.requests, TIER, TIER, "none", "bypass", "200").inc()
        log.info("embeddings", request_id=rid, tenant=tenant.id, inputs=len(texts), tokens=tokens,
                 seconds=round(time.perf_counter() - started, 4))
        headers = {"x-request-id": rid, "x-tiergate-tier": TIER}
        if cost is not None:
            headers["x-tiergate-cost"] = format_cost(cost)
        return Response(msgspec.json.encode({"object": "list", "data": data, "model": req.model,
                                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
                        media_type="application/json", headers=headers)

    async def _settle(self, policy: Policy, tenant: str, key: str, hold: Hold | None, cost: float | None,
                      tokens: int) -> None:
        """Spend `cost` (None: nothing was done) in the metrics and the ledger, and settle `hold` to it."""
        costs = policy.costs
        if costs is None:
            return
        fields: dict[str, float] = {}
        if cost is not None:
            m, currency = self._metrics, costs.currency
            m.child(m.spend, tenant, TIER, TIER, "answer", currency).inc(cost)
            m.child(m.spend_reference, tenant, TIER, TIER, currency).inc(cost)
            count_saving(m, SavingSource.EMBEDDINGS, cost, cost, currency)  # the same work whatever the routing
            fields = {f"cost|{TIER}|{TIER}|answer": cost, f"ref|{TIER}|{TIER}": cost, "requests": 1,
                      "prompt": tokens, "completion": 0, "cost": cost}
        await self._budgets.settle(hold, policy, tenant, key, cost or 0.0, fields)

    def _parse(self, body: bytes) -> EmbeddingRequest:
        try:
            raw = decode_json(_ANY, body)  # any bytes: invalid UTF-8 and deep nesting raise msgspec's errors only
        except (msgspec.DecodeError, msgspec.ValidationError):
            raw = None  # the typed decoding below says what is wrong
        if isinstance(raw, dict) and _is_token_ids(raw.get("input")):
            raise bad_request("Token-id input is not supported: send text (a string or a list of strings).",
                              param="input")
        try:
            req = decode_json(_decoder, body)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise from_validation(exc) from None
        if req.encoding_format not in ("float", "base64"):
            raise bad_request("`encoding_format` must be `float` or `base64`.", param="encoding_format")
        texts = [req.input] if isinstance(req.input, str) else req.input
        limit = self._settings.embeddings_max_inputs
        if not texts or len(texts) > limit:
            raise bad_request(f"`input` must hold 1 to {limit} texts (TIERGATE_EMBEDDINGS_MAX_INPUTS).",
                              param="input")
        if any(not t for t in texts):
            raise bad_request("`input` must not contain an empty string.", param="input")
        chars = sum(len(t) for t in texts)
        if chars > self._settings.max_prompt_chars:
            raise OpenAIError(413, f"`input` has {chars} characters; the limit is {self._settings.max_prompt_chars}.",
                              code="prompt_too_large")
        return req


def _is_token_ids(value: object) -> bool:
    """Input as token ids: a list of integers, or a list of such lists."""
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(v, int) and not isinstance(v, bool) or isinstance(v, list) for v in value)


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it and its SDKs decode it
        return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()
    return [float(x) for x in vector]
