"""The live status page: `/dashboard` (HTML) and `/dashboard/data` (JSON), behind the admin key.

People would rather look than read, so the page shows at a glance where traffic goes (split by tier, cache
hit rate), how fast each tier answers (p50/p95 over the last minute), which backends exist and how loaded
they are, and which policy is active and when it last reloaded. It refreshes itself every second.

The numbers come from `Stats`, a rolling window the gateway feeds once per answered request
(`gateway.dashboard.stats.record(...)` in `Gateway._account`): exact percentiles of this process's recent
requests, not bucket interpolations, and no coupling to the process-wide Prometheus registry (tests run
several gateways in one process). Fleet-wide views belong to Prometheus and Grafana (deploy/grafana).

A browser cannot send a bearer header when a person opens a URL, so besides `Authorization: Bearer
<TIERGATE_ADMIN_KEY>` the page accepts `?key=...` once, answers with a cookie holding an HMAC of the key (not
the key) and redirects to the bare URL so the key does not linger in the address bar or history.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route as HttpRoute

if TYPE_CHECKING:
    from gateway.app import Gateway

__all__ = ["Dashboard", "Stats"]

_COOKIE = "tiergate_dashboard"
_HITS = ("hit-exact", "hit-semantic")


@dataclass(frozen=True, slots=True)
class _Sample:
    t: float
    tier: str
    cache: str
    status: int
    seconds: float


def _percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (a value that really occurred), None when there is nothing to rank."""
    if not sorted_values:
        return None
    return sorted_values[max(0, math.ceil(p * len(sorted_values)) - 1)]


class Stats:
    """A rolling window of recent requests plus totals since start; `record` is O(1) on the request path.

    The window is bounded both in time (`window_s`) and in size (`max_samples`), so a traffic spike costs
    a fixed amount of memory; under more than max_samples/window_s requests per second the percentiles
    describe the most recent max_samples requests.
    """

    def __init__(self, window_s: int = 60, rate_window_s: int = 10, max_samples: int = 20_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        self._clock = clock
        self._samples: deque[_Sample] = deque(maxlen=max_samples)
        self.started = clock()
        self.total = 0
        self.total_by_tier: Counter[str] = Counter()
        self.total_by_cache: Counter[str] = Counter()
        self.total_errors = 0

    def record(self, tier: str, cache: str, status: int, seconds: float) -> None:
        """One answered (or refused with 5xx/429) request: which tier answered, the cache result, how long."""
        self._samples.append(_Sample(self._clock(), tier, cache, status, seconds))
        self.total += 1
        self.total_by_tier[tier] += 1
        self.total_by_cache[cache] += 1
        if status >= 500 or status == 429:
            self.total_errors += 1

    def snapshot(self) -> dict[str, Any]:
        """What the page shows: the last `window_s` seconds per tier and per cache result, a per-second
        series for the chart, and the totals since start."""
        now = self._clock()
        horizon = now - self.window_s
        while self._samples and self._samples[0].t < horizon:
            self._samples.popleft()
        recent = list(self._samples)
        uptime = max(now - self.started, 1e-9)

        per_tier: dict[str, list[_Sample]] = {}
        for s in recent:
            per_tier.setdefault(s.tier, []).append(s)
        tiers = {}
        for tier, samples in per_tier.items():
            secs = sorted(s.seconds for s in samples)
            tiers[tier] = {
                "requests": len(samples),
                "share": len(samples) / len(recent),
                "errors": sum(1 for s in samples if s.status >= 500 or s.status == 429),
                "p50_ms": _ms(_percentile(secs, 0.50)),
                "p95_ms": _ms(_percentile(secs, 0.95)),
                "max_ms": _ms(secs[-1]),
            }

        cache = Counter(s.cache for s in recent)
        hits = sum(cache[k] for k in _HITS)
        lookups = hits + cache["miss"]
        rate_span = min(self.rate_window_s, uptime)
        in_rate = sum(1 for s in recent if s.t >= now - self.rate_window_s)

        series: dict[str, list[int]] = {t: [0] * self.window_s for t in per_tier}
        for s in recent:
            age = int(now - s.t)
            if 0 <= age < self.window_s:
                series[s.tier][self.window_s - 1 - age] += 1  # oldest first, the current second last

        all_secs = sorted(s.seconds for s in recent)
        return {
            "window_s": self.window_s,
            "rate_window_s": self.rate_window_s,
            "uptime_s": round(uptime, 3),
            "requests": len(recent),
            "rps": in_rate / rate_span,
            "errors": sum(1 for s in recent if s.status >= 500 or s.status == 429),
            "p50_ms": _ms(_percentile(all_secs, 0.50)),
            "p95_ms": _ms(_percentile(all_secs, 0.95)),
            "tiers": tiers,
            "cache": {"hit-exact": cache["hit-exact"], "hit-semantic": cache["hit-semantic"],
                      "miss": cache["miss"], "bypass": cache["bypass"], "lookups": lookups,
                      "hit_rate": hits / lookups if lookups else None},
            "series": series,
            "totals": {"requests": self.total, "errors": self.total_errors, "by_tier": dict(self.total_by_tier),
                       "by_cache": dict(self.total_by_cache)},
        }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


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


def _plain(value: Any) -> Any:
    """Endpoint.extra values as JSON-safe scalars (the page shows them as tags)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class Dashboard:
    """The status page of one gateway: owns its `Stats`, reads everything else from the `Gateway` live."""

    def __init__(self, gateway: Gateway, stats: Stats | None = None) -> None:
        self.gateway = gateway
        self.stats = stats or Stats()

    def routes(self) -> list[HttpRoute]:
        return [HttpRoute("/dashboard", self.page, methods=["GET"]),
                HttpRoute("/dashboard/data", self.data, methods=["GET"])]

    # ---- access ----------------------------------------------------------------------------------------------

    def _cookie_token(self, key: str) -> str:
        return hmac.new(key.encode(), b"tiergate-dashboard-v1", hashlib.sha256).hexdigest()

    def _access(self, request: Request) -> str:
        """'ok', 'query' (a valid ?key=), 'disabled' (no admin key configured) or 'denied'."""
        key = self.gateway.settings.admin_key
        if not key:
            return "disabled"
        header = request.headers.get("authorization", "")
        if hmac.compare_digest(header.encode(), f"Bearer {key}".encode()):
            return "ok"
        cookie = request.cookies.get(_COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self._cookie_token(key).encode()):
            return "ok"
        given = request.query_params.get("key")
        if given is not None and hmac.compare_digest(given.encode(), key.encode()):
            return "query"
        return "denied"

    # ---- handlers --------------------------------------------------------------------------------------------

    async def page(self, request: Request) -> Response:
        access = self._access(request)
        if access == "disabled":
            return _html(_MESSAGE_PAGE, 403, title="Dashboard disabled",
                         body="Set TIERGATE_ADMIN_KEY on the gateway to enable the status page.")
        if access == "denied":
            wrong = "key" in request.query_params or _COOKIE in request.cookies
            return _html(_LOGIN_PAGE, 401, error="That key was not accepted." if wrong else "")
        if access == "query":
            response = RedirectResponse("/dashboard", status_code=303)
            response.set_cookie(_COOKIE, self._cookie_token(self.gateway.settings.admin_key), httponly=True,
                                samesite="strict", path="/dashboard", secure=request.url.scheme == "https")
            _harden(response)
            return response
        return _html(_PAGE, 200)

    async def data(self, request: Request) -> Response:
        access = self._access(request)
        if access == "disabled":
            return JSONResponse({"error": {"message": "Admin endpoints are disabled: set TIERGATE_ADMIN_KEY.",
                                           "type": "permission_error", "code": "admin_disabled", "param": None}},
                                status_code=403)
        if access == "denied":
            return JSONResponse({"error": {"message": "Invalid admin key.", "type": "authentication_error",
                                           "code": "invalid_api_key", "param": None}}, status_code=401)
        response = JSONResponse(self.snapshot())
        response.headers["cache-control"] = "no-store"
        return response

    # ---- what the page shows ---------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        gw = self.gateway
        ready, _ = gw.ready()
        return {
            "generated_at": _iso(time.time()),
            "started_at": _iso(gw.started_at),
            "ready": ready,
            "draining": gw.draining,
            "traffic": self.stats.snapshot(),
            "tiers": self._tiers(),
            "policy": self._policy(),
        }

    def _tiers(self) -> list[dict[str, Any]]:
        gw = self.gateway
        out = []
        for name, route in list(gw._routes.items()):
            cfg = gw._tier_configs.get(name)
            try:
                endpoints = route.pool.endpoints()
                healthy = bool(route.pool.healthy())
            except Exception:  # a pool mid-rebuild must not take the status page down
                endpoints, healthy = [], False
            out.append({
                "name": name,
                "kind": getattr(cfg, "kind", "?"),
                "model": getattr(cfg, "model", None),
                "stand_in": bool(getattr(cfg, "stand_in", False)),
                "healthy": healthy,
                "inflight": route.admission.inflight,
                "waiting": route.admission.waiting,
                "endpoints": [{
                    "id": ep.id, "base_url": ep.base_url, "model": ep.model, "slots": ep.slots,
                    "inflight": ep.inflight, "reported_load": round(ep.reported_load, 4),
                    "load": round(ep.load(), 4), "extra": {k: _plain(v) for k, v in ep.extra.items()},
                } for ep in endpoints],
            })
        return out

    def _policy(self) -> dict[str, Any]:
        """The active policy and the outcome of the last reload attempt (policies.store.PolicyStore)."""
        store = self.gateway.policy_store
        current = store.current
        error = getattr(store, "last_error", None)
        attempted = getattr(store, "last_attempt", None)
        return {
            "version": current.version,
            "source": str(getattr(current, "source", None) or getattr(store, "path", "")),
            "loaded_at": _iso(current.loaded_at),
            "last_reload": None if attempted is None else {"ok": error is None, "at": _iso(attempted),
                                                           "error": error},
            "rules": [r.name for r in getattr(current.policy, "rules", [])],
        }


def _harden(response: Response, nonce: str | None = None) -> None:
    """No caching, no framing, no referrer, and only this page's own inline code may run."""
    src = f"'nonce-{nonce}'" if nonce else "'none'"
    response.headers["content-security-policy"] = (
        f"default-src 'none'; script-src {src}; style-src {src}; connect-src 'self'; img-src data:; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
    response.headers["cache-control"] = "no-store"
    response.headers["referrer-policy"] = "no-referrer"
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["x-frame-options"] = "DENY"


def _html(template: str, status: int, **fields: str) -> HTMLResponse:
    import html

    nonce = secrets.token_urlsafe(16)
    text = template.replace("{{nonce}}", nonce)
    for name, value in fields.items():
        text = text.replace("{{" + name + "}}", html.escape(value))
    response = HTMLResponse(text, status_code=status)
    _harden(response, nonce)
    return response


_STYLE = """
:root{--bg:#0b1020;--panel:#131a2e;--panel2:#18213a;--line:#243052;--text:#e6ebff;--muted:#8d98ba;
--edge:#2dd4bf;--cloud:#a78bfa;--cache:#fbbf24;--none:#f87171;--ok:#34d399;--warn:#fbbf24;--bad:#f87171}
*{box-sizing:border-box}html,body{margin:0;background:var(--bg);color:var(--text);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
.wrap{max-width:1280px;margin:0 auto;padding:20px 24px 40px}
header{display:flex;align-items:center;gap:14px;flex-wrap:wrap;margin-bottom:18px}
.brand{font-weight:700;font-size:20px;letter-spacing:.3px}.brand b{color:var(--edge)}
.sub{color:var(--muted)}.spacer{flex:1}
.pill{padding:3px 10px;border-radius:999px;font-size:12px;font-weight:600;background:var(--panel2);
border:1px solid var(--line)}.pill.ok{color:var(--ok);border-color:#1f5f4b}.pill.bad{color:var(--bad);border-color:#6b2a2a}
.pill.warn{color:var(--warn);border-color:#6b5520}
.live{display:inline-flex;align-items:center;gap:6px;color:var(--muted);font-size:12px}
.dot{width:8px;height:8px;border-radius:50%;background:var(--ok);box-shadow:0 0 0 0 rgba(52,211,153,.6)}
.dot.beat{animation:beat .9s ease-out}.dot.stale{background:var(--bad)}
@keyframes beat{0%{box-shadow:0 0 0 0 rgba(52,211,153,.7)}100%{box-shadow:0 0 0 9px rgba(52,211,153,0)}}
.kpis{display:grid;grid-template-columns:repeat(auto-fit,minmax(170px,1fr));gap:12px;margin-bottom:14px}
.card{background:var(--panel);border:1px solid var(--line);border-radius:12px;padding:14px 16px}
.kpi .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.6px}
.kpi .value{font-size:30px;font-weight:700;margin-top:2px;font-variant-numeric:tabular-nums}
.kpi .hint{color:var(--muted);font-size:12px;font-variant-numeric:tabular-nums}
.grid{display:grid;grid-template-columns:2fr 1fr;gap:12px;margin-bottom:12px}
@media (max-width:900px){.grid{grid-template-columns:1fr}}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.7px;color:var(--muted);margin:0 0 10px;font-weight:600}
.split{display:flex;height:22px;border-radius:6px;overflow:hidden;background:var(--panel2);margin-bottom:8px}
.split div{transition:width .4s}
.legend{display:flex;flex-wrap:wrap;gap:14px;font-size:13px;margin-bottom:6px}
.legend span{display:inline-flex;align-items:center;gap:6px;font-variant-numeric:tabular-nums}
.sw{width:10px;height:10px;border-radius:3px;display:inline-block}
svg{display:block;width:100%}
table{width:100%;border-collapse:collapse;font-variant-numeric:tabular-nums}
th{text-align:left;color:var(--muted);font-weight:500;font-size:12px;padding:6px 8px;border-bottom:1px solid var(--line)}
td{padding:7px 8px;border-bottom:1px solid #1b2440;vertical-align:middle}
td.num,th.num{text-align:right}
.bar{position:relative;height:8px;background:var(--panel2);border-radius:4px;min-width:90px;overflow:hidden}
.bar i{position:absolute;left:0;top:0;bottom:0;border-radius:4px;transition:width .4s}
.tiername{display:inline-flex;align-items:center;gap:8px;font-weight:600}
.tag{display:inline-block;font-size:11px;padding:1px 7px;border-radius:999px;background:var(--panel2);
border:1px solid var(--line);color:var(--muted);margin-right:4px}
.tag.bad{color:var(--bad);border-color:#6b2a2a}.tag.warn{color:var(--warn);border-color:#6b5520}
th{white-space:nowrap}
.tier{margin-bottom:12px}.tier:last-child{margin-bottom:0}
.tierhead{display:flex;align-items:center;gap:10px;flex-wrap:wrap;margin-bottom:6px}
.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.muted{color:var(--muted)}.empty{color:var(--muted);padding:10px 0}
.donut{display:flex;align-items:center;gap:16px}
.donut svg{width:140px;height:140px;flex:none}
.kv{display:grid;grid-template-columns:auto 1fr;gap:4px 14px}.kv div:nth-child(odd){color:var(--muted)}
.err{color:var(--bad);white-space:pre-wrap}
form{display:flex;gap:8px;margin-top:14px}
input{flex:1;padding:9px 12px;border-radius:8px;border:1px solid var(--line);background:var(--panel2);color:var(--text)}
button{padding:9px 16px;border-radius:8px;border:0;background:var(--edge);color:#06231f;font-weight:700;cursor:pointer}
.center{max-width:440px;margin:12vh auto}
h2.gap{margin-top:12px}.axis{display:flex;font-size:11px}
.legend.column{flex-direction:column;gap:6px}.block{margin-bottom:12px}th.wide{width:30%}
"""

_MESSAGE_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tiergate · {{title}}</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style nonce="{{nonce}}">""" + _STYLE + """</style>
</head><body><div class="center card"><div class="brand">tier<b>gate</b></div><h2 class="gap">{{title}}</h2>
<p>{{body}}</p></div></body></html>"""

_LOGIN_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tiergate · sign in</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style nonce="{{nonce}}">""" + _STYLE + """</style>
</head><body><div class="center card"><div class="brand">tier<b>gate</b> <span class="sub">status</span></div>
<p class="muted">The status page needs the gateway's admin key (TIERGATE_ADMIN_KEY).</p>
<p class="err" id="login-error">{{error}}</p>
<form method="get" action="/dashboard"><input type="password" name="key" placeholder="admin key" autofocus
autocomplete="current-password"><button type="submit">Open</button></form></div></body></html>"""

_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>tiergate · live status</title>
<meta name="viewport" content="width=device-width,initial-scale=1"><style nonce="{{nonce}}">""" + _STYLE + """</style>
</head><body><div class="wrap">
<header>
  <div class="brand">tier<b>gate</b></div><div class="sub">live status</div>
  <span class="pill" id="ready">…</span>
  <span class="pill" id="policy-pill" title="active policy version">policy …</span>
  <div class="spacer"></div>
  <span class="live"><span class="dot" id="dot"></span><span id="updated">connecting…</span></span>
</header>

<section class="kpis">
  <div class="card kpi"><div class="label">Requests / s</div><div class="value" data-metric="rps">–</div>
    <div class="hint" id="rps-hint">last 10 s</div></div>
  <div class="card kpi"><div class="label">Requests · last min</div><div class="value" data-metric="requests">–</div>
    <div class="hint"><span data-metric="total">–</span> since start</div></div>
  <div class="card kpi"><div class="label">Cache hit rate</div><div class="value" data-metric="hit-rate">–</div>
    <div class="hint" id="hit-hint">of cache lookups</div></div>
  <div class="card kpi"><div class="label">p95 latency</div><div class="value" data-metric="p95">–</div>
    <div class="hint">p50 <span data-metric="p50">–</span></div></div>
  <div class="card kpi"><div class="label">Errors · last min</div><div class="value" data-metric="errors">–</div>
    <div class="hint">5xx and 429</div></div>
  <div class="card kpi"><div class="label">Edge nodes</div><div class="value" data-metric="edge-nodes">–</div>
    <div class="hint" id="edge-hint">–</div></div>
</section>

<section class="grid">
  <div class="card">
    <h2>Traffic by tier · last minute</h2>
    <div class="split" id="split"></div>
    <div class="legend" id="legend"></div>
    <svg id="chart" viewBox="0 0 600 130" preserveAspectRatio="none" role="img" aria-label="requests per second by tier"></svg>
    <div class="muted axis"><span>−60 s</span><span class="spacer"></span>
      <span id="chart-max"></span><span class="spacer"></span><span>now</span></div>
  </div>
  <div class="card">
    <h2>Cache · last minute</h2>
    <div class="donut"><svg id="donut" viewBox="0 0 42 42" role="img" aria-label="cache results"></svg>
      <div class="legend column" id="cache-legend"></div></div>
  </div>
</section>

<section class="card block">
  <h2>Latency by tier · last minute</h2>
  <table id="latency"><thead><tr><th>tier</th><th class="num">requests</th><th class="num">share</th>
  <th class="num">p50</th><th class="num">p95</th><th class="wide"></th><th class="num">errors</th></tr></thead>
  <tbody></tbody></table>
</section>

<section class="grid">
  <div class="card"><h2>Backends</h2><div id="backends"></div></div>
  <div class="card"><h2>Policy</h2><div class="kv" id="policy"></div></div>
</section>
</div>
<script nonce="{{nonce}}">
"use strict";
const PALETTE = {edge:"#2dd4bf", cloud:"#a78bfa", cache:"#fbbf24", none:"#f87171"};
const EXTRA = ["#60a5fa","#f472b6","#4ade80","#fb923c","#22d3ee","#e879f9"];
const CACHE_COLORS = {"hit-exact":"#fbbf24","hit-semantic":"#f97316","miss":"#64748b","bypass":"#334155"};
const $ = (sel) => document.querySelector(sel);
const SVGNS = "http://www.w3.org/2000/svg";
let kinds = {}, lastOk = 0;

function el(tag, attrs, ...children) {
  const e = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v;
    else if (k === "style") Object.assign(e.style, v); else e.setAttribute(k, v);
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}
function color(tier) {
  if (PALETTE[tier]) return PALETTE[tier];
  if (PALETTE[kinds[tier]] && kinds[tier] !== tier) return shade(PALETTE[kinds[tier]], tier);
  let h = 0; for (const ch of tier) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return EXTRA[h % EXTRA.length];
}
function shade(hex, seed) {  // a tier of a known kind with another name: same hue family, distinct lightness
  let h = 0; for (const ch of seed) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  const f = 0.75 + (h % 5) * 0.1, n = parseInt(hex.slice(1), 16);
  const c = (s) => Math.max(0, Math.min(255, Math.round(((n >> s) & 255) * f)));
  return "rgb(" + c(16) + "," + c(8) + "," + c(0) + ")";
}
function label(tier) { return tier === "none" ? "refused / failed" : tier; }
function ms(v) {
  if (v == null) return "–";
  if (v < 1) return v.toFixed(2) + " ms";
  if (v < 1000) return v.toFixed(v < 10 ? 1 : 0) + " ms";
  return (v / 1000).toFixed(v < 10000 ? 2 : 1) + " s";
}
function pct(v) { return v == null ? "–" : (v * 100).toFixed(v >= 0.995 || v === 0 ? 0 : 1) + "%"; }
function num(v) { return v == null ? "–" : v.toLocaleString("en-US"); }
function ago(iso) {
  if (!iso) return "";
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (s < 60) return s + " s ago"; if (s < 3600) return Math.floor(s / 60) + " min ago";
  if (s < 86400) return Math.floor(s / 3600) + " h ago"; return Math.floor(s / 86400) + " d ago";
}
function setMetric(name, text) { const e = $('[data-metric="' + name + '"]'); if (e.textContent !== text) e.textContent = text; }
function loadColor(x) { return x < 0.6 ? "var(--ok)" : x < 0.9 ? "var(--warn)" : "var(--bad)"; }
function bar(frac, fill) {
  return el("div", {class: "bar"}, el("i", {style: {width: Math.max(0, Math.min(1, frac)) * 100 + "%", background: fill}}));
}

function endpointTags(extra) {  // what a person needs from a backend's extra fields, not all of them
  const out = [];
  for (const [k, v] of Object.entries(extra)) {
    if (v === null || v === "" || k === "busy" || k === "queued") continue;
    if (k === "up") { if (v === false) out.push(el("span", {class: "tag bad", text: "down"})); continue; }
    if (k === "draining") { if (v === true) out.push(el("span", {class: "tag warn", text: "draining"})); continue; }
    if (k === "seen" && typeof v === "number") { out.push(el("span", {class: "tag", text: "seen " + ago(new Date(v * 1000).toISOString())})); continue; }
    out.push(el("span", {class: "tag" + (k === "breaker" && v !== "closed" ? " warn" : ""), text: k + ": " + v}));
  }
  return out;
}

function tierOrder(d) {
  const names = d.tiers.map((t) => t.name);
  for (const t of Object.keys(d.traffic.tiers)) if (!names.includes(t) && t !== "cache" && t !== "none") names.push(t);
  names.push("cache", "none");
  return names;
}

function render(d) {
  kinds = Object.fromEntries(d.tiers.map((t) => [t.name, t.kind]));
  const tr = d.traffic, order = tierOrder(d);
  const ready = $("#ready");
  ready.textContent = d.draining ? "draining" : d.ready ? "ready" : "not ready";
  ready.className = "pill " + (d.draining ? "warn" : d.ready ? "ok" : "bad");
  const pp = $("#policy-pill"), failed = d.policy.last_reload && !d.policy.last_reload.ok;
  pp.textContent = "policy " + (d.policy.version || "?") + (failed ? " · reload failed" : "");
  pp.className = "pill" + (failed ? " warn" : "");

  setMetric("rps", tr.rps.toFixed(tr.rps >= 100 ? 0 : tr.rps >= 10 ? 1 : 2));
  setMetric("requests", num(tr.requests));
  setMetric("total", num(tr.totals.requests));
  setMetric("hit-rate", pct(tr.cache.hit_rate));
  $("#hit-hint").textContent = "of " + num(tr.cache.lookups) + " lookups · " + num(tr.cache.bypass) + " bypassed";
  setMetric("p95", ms(tr.p95_ms)); setMetric("p50", ms(tr.p50_ms));
  setMetric("errors", num(tr.errors));
  const edge = d.tiers.filter((t) => t.kind === "edge");
  const eps = edge.flatMap((t) => t.endpoints);
  setMetric("edge-nodes", num(eps.length));
  const slots = eps.reduce((a, e) => a + e.slots, 0), busy = eps.reduce((a, e) => a + e.load * e.slots, 0);
  $("#edge-hint").textContent = eps.length ? slots + " slots · " + pct(slots ? busy / slots : 0) + " busy"
                                           : edge.length ? "none registered" : "no edge tier";

  // traffic split
  const split = $("#split"), legend = $("#legend");
  split.replaceChildren(); legend.replaceChildren();
  for (const t of order) {
    const s = tr.tiers[t]; if (!s) continue;
    split.append(el("div", {title: label(t), "data-tier": t, style: {width: s.share * 100 + "%", background: color(t)}}));
  }
  for (const t of order) {
    const s = tr.tiers[t]; if (!s && (t === "none" || t === "cache")) continue;
    legend.append(el("span", {"data-tier": t}, el("i", {class: "sw", style: {background: color(t)}}),
      label(t) + " ", el("b", {"data-share": t, text: s ? pct(s.share) : "0%"})));
  }
  if (!tr.requests) split.append(el("div", {style: {width: "100%", background: "transparent"}}));

  // per-second chart, stacked by tier
  const chart = $("#chart"); chart.replaceChildren();
  const n = tr.window_s, totals = new Array(n).fill(0);
  for (const t of order) (tr.series[t] || []).forEach((v, i) => totals[i] += v);
  const peak = Math.max(1, ...totals), w = 600 / n, H = 124;
  for (let y = 0; y <= 2; y++) chart.append(el("svg:line", {x1: 0, x2: 600, y1: 2 + y * H / 2, y2: 2 + y * H / 2,
    stroke: "#243052", "stroke-width": 1, "vector-effect": "non-scaling-stroke"}));
  for (let i = 0; i < n; i++) {
    let y0 = H + 2;
    for (const t of order) {
      const v = (tr.series[t] || [])[i] || 0; if (!v) continue;
      const h = v / peak * H; y0 -= h;
      chart.append(el("svg:rect", {x: i * w + 1, y: y0, width: w - 2, height: h, fill: color(t), rx: 1.5}));
    }
  }
  $("#chart-max").textContent = "peak " + peak + " req/s";

  // cache donut
  const donut = $("#donut"), cl = $("#cache-legend"); donut.replaceChildren(); cl.replaceChildren();
  const parts = ["hit-exact", "hit-semantic", "miss", "bypass"], tot = parts.reduce((a, k) => a + tr.cache[k], 0);
  donut.append(el("svg:circle", {cx: 21, cy: 21, r: 15.915, fill: "none", stroke: "#18213a", "stroke-width": 6}));
  let off = 25;
  for (const k of parts) {
    const v = tr.cache[k]; if (!v) continue;
    const len = v / tot * 100;
    donut.append(el("svg:circle", {cx: 21, cy: 21, r: 15.915, fill: "none", stroke: CACHE_COLORS[k],
      "stroke-width": 6, "stroke-dasharray": len + " " + (100 - len), "stroke-dashoffset": off}));
    off -= len;
  }
  donut.append(el("svg:text", {x: 21, y: 22.5, "text-anchor": "middle", fill: "#e6ebff", "font-size": 6.5,
    "font-weight": 700, text: pct(tr.cache.hit_rate)}));
  donut.append(el("svg:text", {x: 21, y: 28, "text-anchor": "middle", fill: "#8d98ba", "font-size": 3, text: "hit rate"}));
  for (const k of parts) cl.append(el("span", {}, el("i", {class: "sw", style: {background: CACHE_COLORS[k]}}),
    k + " ", el("b", {"data-cache": k, text: num(tr.cache[k])})));

  // latency table
  const body = $("#latency tbody"); body.replaceChildren();
  const maxP95 = Math.max(1e-9, ...Object.values(tr.tiers).map((s) => s.p95_ms || 0));
  let rows = 0;
  for (const t of order) {
    const s = tr.tiers[t]; if (!s) continue; rows++;
    body.append(el("tr", {"data-tier": t},
      el("td", {}, el("span", {class: "tiername"}, el("i", {class: "sw", style: {background: color(t)}}), label(t))),
      el("td", {class: "num", "data-col": "requests", text: num(s.requests)}),
      el("td", {class: "num", text: pct(s.share)}),
      el("td", {class: "num", "data-col": "p50", text: ms(s.p50_ms)}),
      el("td", {class: "num", "data-col": "p95", text: ms(s.p95_ms)}),
      el("td", {}, bar(s.p95_ms / maxP95, color(t))),
      el("td", {class: "num", text: num(s.errors)})));
  }
  if (!rows) body.append(el("tr", {}, el("td", {colspan: 7, class: "empty", text: "No requests in the last minute."})));

  // backends
  const be = $("#backends"); be.replaceChildren();
  for (const t of d.tiers) {
    const head = el("div", {class: "tierhead"},
      el("span", {class: "tiername"}, el("i", {class: "sw", style: {background: color(t.name)}}), t.name),
      el("span", {class: "tag", text: t.kind}), t.model ? el("span", {class: "tag mono", text: t.model}) : null,
      t.stand_in ? el("span", {class: "tag", text: "local stand-in"}) : null,
      el("span", {class: "pill " + (t.healthy ? "ok" : "bad"), text: t.healthy ? "healthy" : "unavailable"}),
      el("span", {class: "muted", text: t.inflight + " in flight · " + t.waiting + " waiting"}));
    const box = el("div", {class: "tier", "data-tier": t.name}, head);
    if (!t.endpoints.length) {
      box.append(el("div", {class: "empty", text: t.kind === "edge" ? "No edge node registered." : "No endpoint."}));
    } else {
      const tb = el("tbody");
      for (const e of t.endpoints) {
        const tags = endpointTags(e.extra);
        tb.append(el("tr", {"data-endpoint": e.id},
          el("td", {}, el("div", {text: e.id}), el("div", {class: "muted mono", text: e.base_url}), ...tags),
          el("td", {class: "num", "data-col": "slots", text: String(e.slots)}),
          el("td", {class: "num", "data-col": "inflight", text: String(e.inflight)}),
          el("td", {style: {width: "34%"}}, bar(e.load, loadColor(e.load))),
          el("td", {class: "num", "data-col": "load", text: pct(e.load)})));
      }
      box.append(el("table", {}, el("thead", {}, el("tr", {}, el("th", {text: "endpoint"}),
        el("th", {class: "num", text: "slots"}), el("th", {class: "num", text: "in flight"}),
        el("th", {text: "load"}), el("th", {class: "num", text: ""}))), tb));
    }
    be.append(box);
  }
  if (!d.tiers.length) be.append(el("div", {class: "empty", text: "No tiers in the active policy."}));

  // policy
  const p = d.policy, pv = $("#policy"), lr = p.last_reload; pv.replaceChildren();
  const row = (k, v, attrs) => pv.append(el("div", {text: k}), el("div", attrs || {}, v));
  row("version", el("span", {class: "mono", "data-policy": "version", text: p.version || "?"}));
  row("source", el("span", {class: "mono", text: p.source || "?"}));
  row("loaded", el("span", {"data-policy": "loaded", text: p.loaded_at ? new Date(p.loaded_at).toLocaleString() + " · " + ago(p.loaded_at) : "?"}));
  if (lr) {
    row("last reload", el("span", {class: lr.ok ? "" : "err", "data-policy": "last-reload",
      text: (lr.ok ? "ok" : "REJECTED, still serving " + (p.version || "?")) + (lr.at ? " · " + ago(lr.at) : "")}));
    if (!lr.ok && lr.error) row("error", el("span", {class: "err mono", text: lr.error}));
  }
  if (p.rules && p.rules.length) row("rules", el("span", {class: "mono", text: p.rules.join(" → ")}));
  row("gateway up", el("span", {text: ago(d.started_at).replace(" ago", "")}));
}

async function tick() {
  try {
    const r = await fetch("/dashboard/data", {cache: "no-store", credentials: "same-origin"});
    if (r.status === 401 || r.status === 403) { location.href = "/dashboard"; return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    lastOk = Date.now();
    const dot = $("#dot"); dot.classList.remove("beat", "stale"); void dot.offsetWidth; dot.classList.add("beat");
    $("#updated").textContent = "live · updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("#dot").classList.add("stale");
    $("#updated").textContent = "gateway unreachable" + (lastOk ? " · last update " + new Date(lastOk).toLocaleTimeString() : "");
  } finally {
    setTimeout(tick, 1000);
  }
}
tick();
</script></body></html>"""
