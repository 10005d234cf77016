"""`POST /v1/messages/count_tokens`: the prompt tokens of an Anthropic Messages request, as the gateway counts them.

The count is the routing policy's own (`policies.classify`): the tokenizer of the model family the request
targets, over the translated chat request, which is the number the policy's rules, the tier's `max_context` and
the tenant's token budget are checked against. Nothing is generated and nothing is charged.

Tested in `tests/gateway/test_messages_api.py` and `tests/integration/test_api_surfaces.py`.
"""

from __future__ import annotations

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from tiergate.core.errors import OpenAIError, from_validation
from tiergate.core.http import read_body
from tiergate.core.wire import decode_chat, decode_json
from tiergate.gateway.auth import Authenticator
from tiergate.gateway.messages_api import anthropic_error, to_chat
from tiergate.gateway.params import check_params
from tiergate.gateway.surface import SurfaceLimits, authorization
from tiergate.gateway.tiers import Tiers
from tiergate.policies.classify import Classifier

__all__ = ["TokenCount"]

_JSON = "application/json"
_object = msgspec.json.Decoder(dict[str, msgspec.Raw])


class TokenCount:
    """The endpoint; errors in Anthropic's format."""

    def __init__(self, keyring: Authenticator, routing: Tiers, classifier: Classifier, limits: SurfaceLimits) -> None:
        self._keyring = keyring
        self._routing = routing
        self._classifier = classifier
        self._limits = limits

    async def handle(self, request: Request) -> Response:
        try:
            tenant = self._keyring.authenticate(authorization(request))
            body = await read_body(request, self._limits.max_body_bytes, self._limits.body_timeout_s)
            try:
                fields = decode_json(_object, body)
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                raise from_validation(exc) from None
            fields.setdefault("max_tokens", msgspec.Raw(b"1"))  # not part of a count request; needed by a message
            fields.pop("stream", None)
            chat, _ = to_chat(msgspec.json.encode(fields))
            req = decode_chat(msgspec.json.encode(chat))
            policy = self._routing.current.active.policy
            if (served := policy.resolve_model(req.model)) != req.model:  # a client's own name, as /v1/messages reads it
                req = msgspec.structs.replace(req, model=served)
            check_params(req, [t.model for t in policy.tiers.values()])
            features = self._classifier.features(req, tenant.id, tenant.priority, request.headers, policy)
        except OpenAIError as exc:
            return Response(anthropic_error(exc.status, exc.body()["error"]), status_code=exc.status,
                            media_type=_JSON, headers=exc.headers)
        except ClientDisconnect:
            return Response(status_code=499)
        return Response(msgspec.json.encode({"input_tokens": features.prompt_tokens}), media_type=_JSON)
