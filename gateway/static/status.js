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

// ---- over time: the history the gateway samples every step (gateway/history.py) ---------------------------------
const SOURCE_COLORS = {edge: PALETTE.edge, cloud: PALETTE.cloud, cache: PALETTE.cache, cascade: "#60a5fa"};
let drawnAt = null;  // the last step drawn: the charts change once a step, not on every poll

function lines(svg, legendBox, list) {  // list: [{name, color, values}] on one scale; a null breaks a line
  svg.replaceChildren(); legendBox.replaceChildren();
  const n = Math.max(2, ...list.map((s) => s.values.length));
  const all = list.flatMap((s) => s.values.filter((v) => v != null && isFinite(v)));
  let lo = Math.min(0, ...all), hi = Math.max(0, ...all);
  if (!(hi - lo > 1e-12)) hi = lo + 1;  // nothing yet: a flat line at zero, never a division by zero
  const x = (i) => (i * 300) / (n - 1), y = (v) => 88 - ((v - lo) / (hi - lo)) * 84;
  if (lo < 0) svg.append(el("svg:line", {x1: 0, x2: 300, y1: y(0), y2: y(0), stroke: "#334155", "stroke-width": 1}));
  for (const s of list) {
    let d = "", pen = false;
    const ok = (v) => v != null && isFinite(v);
    s.values.forEach((v, i) => {
      if (!ok(v)) { pen = false; return; }
      d += (pen ? " L" : " M") + x(i).toFixed(1) + " " + y(v).toFixed(1); pen = true;
      if (!ok(s.values[i - 1]) && !ok(s.values[i + 1]))  // a point with no neighbour draws no line: a dot
        svg.append(el("svg:circle", {cx: x(i), cy: y(v), r: 2.5, fill: s.color, "data-series": s.name}));
    });
    if (d) svg.append(el("svg:path", {d: d.trim(), fill: "none", stroke: s.color, "stroke-width": 1.6,
                                  "vector-effect": "non-scaling-stroke", "data-series": s.name}));
    legendBox.append(el("span", {}, el("i", {class: "sw", style: {background: s.color}}), s.name));
  }
}

function money(v, cur) { return v == null ? "–" : v.toFixed(Math.abs(v) >= 1 ? 2 : 6) + (cur ? " " + cur : ""); }

function renderHistory(h) {
  if (!h) return;
  const se = h.series, cur = h.costs.currency;
  const last = se.t.length ? se.t[se.t.length - 1] : null;
  if (last !== drawnAt) {
    drawnAt = last;
    $("#h-span").textContent = "· " + se.t.length + " steps of " + h.step_s + " s";
    lines($("#h-requests"), $("#h-requests-legend"),
          Object.entries(se.requests).map(([t, v]) => ({name: label(t), color: color(t), values: v})));
    lines($("#h-spend"), $("#h-spend-legend"), [
      {name: "spend", color: PALETTE.none, values: se.spend},
      {name: "all-cloud", color: "#94a3b8", values: se.spend.map((v, i) => v + se.saved[i])}]);
    lines($("#h-saved"), $("#h-saved-legend"), Object.entries(se.saved_by).map(([s, v]) => ({
      name: s, color: SOURCE_COLORS[s] || "#34d399", values: v})));
    lines($("#h-rates"), $("#h-rates-legend"), [
      {name: "cache hit rate", color: PALETTE.cache, values: se.hit_rate},
      {name: "cascade kept", color: "#60a5fa", values: se.cascade_kept_rate}]);
  }
  const c = h.costs, q = c.quality, box = $("#h-totals");
  box.replaceChildren();
  const row = (k, v, attr) => box.append(el("div", {text: k}), el("div", {"data-total": attr, text: v}));
  row("spend since start", money(c.spend, cur), "spend");
  row("all-cloud price", money(c.reference, cur), "reference");
  row("saved", money(c.saved, cur) + (c.reference ? " (" + pct(c.saved / c.reference) + ")" : ""), "saved");
  row("saved by", Object.entries(c.saved_by).map(([s, v]) => s + " " + money(v)).join(" · ") || "–", "saved-by");
  row("its quality cost", "cascade escalated " + pct(q.cascade.escalated_share) + " · shadow checks wrong "
      + pct(q.shadow_checks.wrong_share) + " · feedback wrong " + pct(q.cache_feedback.wrong_share), "quality");
  const body = $("#tenants tbody"); body.replaceChildren();
  for (const t of h.tenants) {
    body.append(el("tr", {"data-tenant": t.tenant}, el("td", {class: "mono", text: t.tenant}),
      el("td", {class: "num", text: money(t.spend)}), el("td", {class: "num", text: money(t.reference)}),
      el("td", {class: "num", text: money(t.saved)})));
  }
  if (!h.tenants.length) body.append(el("tr", {}, el("td", {colspan: 4, class: "empty", text: "no spend yet"})));
}

async function tick() {
  try {
    const r = await fetch("/dashboard/data", {cache: "no-store", credentials: "same-origin"});
    if (r.status === 401 || r.status === 403) { location.href = "/dashboard"; return; }
    if (!r.ok) throw new Error("HTTP " + r.status);
    const data = await r.json();
    render(data);
    renderHistory(data.history);
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
