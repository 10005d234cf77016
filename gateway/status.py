"""The live status page: `/dashboard` (HTML), `/dashboard/data` (JSON), `/dashboard/static/` (its CSS and JS).

People would rather look than read, so the page shows at a glance where traffic goes (split by tier, cache
hit rate), how fast each tier answers (p50/p95 over the last minute), which backends exist and how loaded
they are, and which policy is active and when it last reloaded. The page itself is static files
(`gateway/static/`); its script polls `/dashboard/data` every second. The numbers come from the gateway's
`Stats` (`gateway.stats`) and its public view of the tiers (`Gateway.tiers`).

Both need the admin key. A browser cannot send a bearer header when a person opens a URL, so besides
`Authorization: Bearer <TIERGATE_ADMIN_KEY>` the page accepts `?key=...` once, answers with a cookie holding an
HMAC of the key (not the key) and redirects to the bare URL so the key does not linger in the address bar or
history.
"""

from __future__ import annotations

import hmac
import html
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tiergate.core.errors import OpenAIError
from tiergate.core.http import error_response
from tiergate.gateway.admin import AdminKey
from tiergate.gateway.history import History
from tiergate.gateway.stats import Stats
from tiergate.gateway.tiers import Tiers
from tiergate.policies.costs import CostsConfig
from tiergate.policies.store import PolicyStore

__all__ = ["StatusPage", "StatusSource"]

STATIC = Path(__file__).resolve().parent / "static"
_COOKIE = "tiergate_dashboard"
_COOKIE_PURPOSE = b"tiergate-dashboard-v1"
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def _template(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class StatusSource:
    """What the page reads: the gateway's collaborators themselves (live objects) and two questions asked on each
    look (`draining`, `ready`), so the page never holds the whole gateway."""

    admin: AdminKey
    started_at: float
    stats: Stats
    history: History
    tiers: Tiers
    policy_store: PolicyStore
    draining: Callable[[], bool]
    ready: Callable[[], tuple[bool, dict[str, object]]]


class StatusPage:
    """The status page of one gateway: reads everything from its `StatusSource`, live."""

    def __init__(self, source: StatusSource) -> None:
        self._gw = source
        self._pages = {name: _template(name) for name in ("status.html", "login.html", "message.html")}

    def routes(self) -> list[Route | Mount]:
        return [Route("/dashboard", self.page, methods=["GET"]),
                Route("/dashboard/data", self.data, methods=["GET"]),
                Mount("/dashboard/static", StaticFiles(directory=STATIC), name="status-static")]

    # ---- access ----------------------------------------------------------------------------------------------

    def _access(self, request: Request) -> str:
        """'ok', 'query' (a valid ?key=), 'disabled' (no admin key configured) or 'denied'."""
        admin = self._gw.admin
        if not admin.enabled:
            return "disabled"
        if admin.bearer(request):
            return "ok"
        cookie = request.cookies.get(_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), admin.derived(_COOKIE_PURPOSE).encode()):
            return "ok"
        if admin.matches(request.query_params.get("key")):
            return "query"
        return "denied"

    # ---- handlers --------------------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        access = self._access(request)
        if access == "disabled":
            return self._html("message.html", 403, title="Dashboard disabled",
                              body="Set TIERGATE_ADMIN_KEY on the gateway to enable the status page.")
        if access == "denied":
            wrong = "key" in request.query_params or _COOKIE in request.cookies
            return self._html("login.html", 401, error="That key was not accepted." if wrong else "")
        if access == "query":
            response = RedirectResponse("/dashboard", status_code=303)
            response.set_cookie(_COOKIE, self._gw.admin.derived(_COOKIE_PURPOSE), httponly=True,
                                samesite="strict", path="/dashboard", secure=request.url.scheme == "https")
            _harden(response)
            return response
        return self._html("status.html", 200)

    async def data(self, request: Request) -> Response:
        if self._access(request) not in ("ok", "query"):
            try:
                self._gw.admin.require(request)  # raises: 403 when the admin surface is off, else 401
            except OpenAIError as exc:
                return error_response(exc)
        response = JSONResponse(self.snapshot())
        response.headers["cache-control"] = "no-store"
        return response

    def _html(self, name: str, status: int, **fields: str) -> HTMLResponse:
        text = self._pages[name]
        for key, value in fields.items():
            text = text.replace("{{" + key + "}}", html.escape(value))
        response = HTMLResponse(text, status_code=status)
        _harden(response)
        return response

    # ---- what the page shows ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        gw = self._gw
        ready, _ = gw.ready()
        return {
            "generated_at": _iso(time.time()),
            "started_at": _iso(gw.started_at),
            "ready": ready,
            "draining": gw.draining(),
            "traffic": gw.stats.snapshot(),
            "history": gw.history.snapshot(),
            "tiers": self._tiers(),
            "policy": self._policy(),
        }

    def _tiers(self) -> list[dict[str, Any]]:
        out = []
        for tier in list(self._gw.tiers.values()):
            try:
                endpoints = tier.pool.endpoints()
                healthy = bool(tier.pool.healthy())
            except Exception:  # a pool mid-rebuild must not take the status page down
                endpoints, healthy = [], False
            out.append({
                "name": tier.name,
                "kind": tier.config.kind,
                "model": tier.config.model,
                "stand_in": tier.config.stand_in,
                "healthy": healthy,
                "inflight": tier.admission.inflight,
                "waiting": tier.admission.waiting,
                "endpoints": [{
                    "id": ep.id, "base_url": ep.base_url, "model": ep.model, "slots": ep.slots,
                    "inflight": ep.inflight, "reported_load": round(ep.reported_load, 4),
                    "load": round(ep.load(), 4), "extra": {k: _plain(v) for k, v in ep.extra.items()},
                } for ep in endpoints],
            })
        return out

    def _policy(self) -> dict[str, Any]:
        """The active policy and the outcome of the last reload attempt (policies.store.PolicyStore)."""
        store = self._gw.policy_store
        current = store.current
        attempted = store.last_attempt
        return {
            "version": current.version,
            "source": str(current.source or store.path),
            "loaded_at": _iso(current.loaded_at),
            "last_reload": None if attempted is None else {"ok": store.last_error is None, "at": _iso(attempted),
                                                           "error": store.last_error},
            "rules": [r.name for r in current.policy.rules],
            "costs": _prices(current.policy.costs, list(current.policy.tiers)),
        }


def _prices(costs: CostsConfig | None, tiers: list[str]) -> dict[str, Any] | None:
    """The cost model as it prices now: per tier, its price per 1,000 completion tokens and which figure that
    came from (the policy's token prices, a node benchmark, or the nodes' live throughput)."""
    if costs is None:
        return None
    out: dict[str, Any] = {"currency": costs.currency, "reference_tier": costs.reference_tier, "tiers": {}}
    for name in tiers:
        price, basis, found = costs.tier_price(name), costs.basis(name), costs.throughput(name)
        out["tiers"][name] = None if price is None or basis is None else {
            "prompt_per_1k": price.prompt_per_1k, "completion_per_1k": price.completion_per_1k,
            "basis": basis.value, "tokens_per_s": None if found is None else round(found[0], 3)}
    return out


def _harden(response: Response) -> None:
    """No caching, no framing, no referrer, and only this gateway's own script and style may run."""
    response.headers["content-security-policy"] = _CSP
    response.headers["cache-control"] = "no-store"
    response.headers["referrer-policy"] = "no-referrer"
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["x-frame-options"] = "DENY"


def _plain(value: Any) -> Any:
    """Endpoint.extra values as JSON-safe scalars (the page shows them as tags)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _iso(value: Any) -> str | None:
    """A timestamp (epoch seconds or datetime) as ISO 8601 UTC, for the browser to localise."""
    if value is None:
        return None
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
    elif isinstance(value, (int, float)):
        dt = datetime.fromtimestamp(value, tz=UTC)
    else:
        return str(value)
    return dt.astimezone(UTC).isoformat(timespec="seconds")
