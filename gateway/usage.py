"""`GET /v1/usage`: what the calling key spent in the current period, and what its budgets have left.

Why this route and not OpenAI's: OpenAI's `/v1/dashboard/billing/*` was never a documented API and is gone, and
its `/v1/organization/usage/*` takes an admin key and reports a whole organisation; neither fits "a key reads its
own usage". So the route keeps OpenAI's style (a `/v1/` path, a bearer key, a JSON object with an `object` field,
OpenAI-format errors) and answers only for the key it was called with: its own spend, requests and tokens (never
another key's, nor the tenant's total), and the `remaining` of the budgets it is under, its tenant's included.
`?period=day|week|month` picks the period when the key has no budget of its own (default: its budget's, else
the month).

Tested in `tests/gateway/test_usage.py` and `tests/integration/test_budgets_redis.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from tiergate.core.errors import bad_request
from tiergate.gateway.auth import Authenticator
from tiergate.gateway.budgets import Budgets
from tiergate.policies.budgets import Period
from tiergate.policies.model import Policy

__all__ = ["UsageEndpoint"]


class UsageEndpoint:
    def __init__(self, keys: Authenticator, budgets: Budgets, policy: Callable[[], Policy]) -> None:
        self._keys = keys
        self._budgets = budgets
        self._policy = policy

    async def handle(self, request: Request) -> Response:
        tenant, digest = self._keys.identify(request.headers.get("authorization"))
        asked = request.query_params.get("period")
        try:
            period = Period(asked) if asked is not None else None
        except ValueError:
            raise bad_request(f"`period` must be one of {[p.value for p in Period]}.", code="invalid_period",
                              param="period") from None
        policy = self._policy()
        u = await self._budgets.usage(policy, tenant.id, digest, period)
        return JSONResponse({
            "object": "usage", "tenant": tenant.id,
            "period": {"id": u.period.id,
                       "start": u.period.start.isoformat(), "end": u.period.end.isoformat()},
            "currency": u.currency or None, "spend": u.spend, "requests": u.requests,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "budgets": u.budgets,
        })
