"""The status page: its rolling statistics, its access control, and the page itself in a real browser.

The browser test runs Debian's chromium against a real gateway (uvicorn, a real policy, an instant
OpenAI-compatible backend as the edge tier and an edge node registering through the real heartbeat
endpoint), sends traffic, and watches the numbers on the page change.
"""

from __future__ import annotations

import os
import re
import textwrap
import uuid
from pathlib import Path

import httpx
import pytest

from tests.support.browser import chromium, text_of, wait_for
from tests.support.instant_upstream import make_app
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server, gateway_server
from tiergate.gateway.settings import Settings
from tiergate.gateway.stats import Stats

ADMIN_KEY = "dashboard-admin-key-0123456789"
DEMO = {"Authorization": "Bearer tg-demo-key"}


# ---- Stats: the rolling window, on a clock the test moves ----------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_empty_window_has_no_percentiles_and_no_hit_rate():
    snap = Stats(clock=Clock()).snapshot()
    assert snap["requests"] == 0 and snap["rps"] == 0
    assert snap["p50_ms"] is None and snap["p95_ms"] is None
    assert snap["cache"]["hit_rate"] is None and snap["tiers"] == {}


def test_split_percentiles_and_cache_rate_per_tier():
    stats = Stats(clock=Clock())
    for i in range(1, 21):  # edge: 10 ms .. 200 ms
        stats.record("edge", "miss", 200, i / 100)
    for _ in range(10):
        stats.record("cache", "hit-exact", 200, 0.001)
    for _ in range(5):
        stats.record("cache", "hit-semantic", 200, 0.004)
    stats.record("cloud", "bypass", 200, 2.0)
    stats.record("none", "miss", 503, 0.05)
    snap = stats.snapshot()

    assert snap["requests"] == 37
    assert snap["tiers"]["edge"]["requests"] == 20
    assert snap["tiers"]["edge"]["share"] == 20 / 37
    assert snap["tiers"]["edge"]["p50_ms"] == 100.0  # nearest rank: the 10th of 20
    assert snap["tiers"]["edge"]["p95_ms"] == 190.0  # the 19th of 20
    assert snap["tiers"]["edge"]["max_ms"] == 200.0
    assert snap["tiers"]["cloud"]["p50_ms"] == snap["tiers"]["cloud"]["p95_ms"] == 2000.0
    assert snap["tiers"]["none"]["errors"] == 1 and snap["errors"] == 1
    # the hit rate counts only requests that were looked up: 15 hits, 21 misses; the bypass does not count
    assert snap["cache"]["lookups"] == 36
    assert snap["cache"]["hit_rate"] == 15 / 36
    assert snap["cache"]["hit-semantic"] == 5 and snap["cache"]["bypass"] == 1


def test_old_requests_leave_the_window_but_stay_in_the_totals():
    clock = Clock()
    stats = Stats(window_s=60, clock=clock)
    stats.record("edge", "miss", 200, 0.1)
    clock.now += 30
    stats.record("cloud", "miss", 200, 1.0)
    assert stats.snapshot()["requests"] == 2
    clock.now += 45  # the edge request is 75 s old now
    snap = stats.snapshot()
    assert snap["requests"] == 1 and set(snap["tiers"]) == {"cloud"}
    assert snap["totals"]["requests"] == 2 and snap["totals"]["by_tier"] == {"edge": 1, "cloud": 1}


def test_rate_uses_the_recent_seconds_and_the_series_places_requests_by_age():
    clock = Clock()
    stats = Stats(window_s=60, rate_window_s=10, clock=clock)
    clock.now += 100  # running long enough that the 10 s rate window is full
    for _ in range(4):
        stats.record("edge", "miss", 200, 0.1)
    clock.now += 5
    for _ in range(6):
        stats.record("cloud", "miss", 200, 0.1)
    clock.now += 0.5
    snap = stats.snapshot()
    assert snap["rps"] == 10 / 10
    edge, cloud = snap["series"]["edge"], snap["series"]["cloud"]
    assert len(edge) == 60 and sum(edge) == 4 and sum(cloud) == 6
    assert edge[59 - 5] == 4  # 5.5 s ago: five whole seconds back from the newest bin
    assert cloud[59] == 6  # this second


def test_rate_right_after_start_is_not_diluted_by_time_before_start():
    clock = Clock()
    stats = Stats(rate_window_s=10, clock=clock)
    clock.now += 2
    for _ in range(4):
        stats.record("edge", "miss", 200, 0.1)
    assert stats.snapshot()["rps"] == 2.0


def test_memory_is_bounded_by_max_samples():
    stats = Stats(max_samples=100, clock=Clock())
    for _ in range(1000):
        stats.record("edge", "miss", 200, 0.1)
    snap = stats.snapshot()
    assert snap["requests"] == 100 and snap["totals"]["requests"] == 1000


# ---- a real gateway ------------------------------------------------------------------------------------------

def _policy(upstream: str) -> str:
    """Everything to the edge tier (the instant backend, statically configured); exact-match caching on."""
    return textwrap.dedent(f"""\
        version: 1
        tiers:
          edge:
            kind: edge
            model: tiergate-edge
            endpoints: ["{upstream}"]
          cloud:
            kind: cloud
            model: tiergate-cloud
            endpoints: ["{upstream}"]
            stand_in: true
        rules:
          - name: everything-to-edge
            tier: edge
            fallbacks: [cloud]
            cache: {{enabled: true, semantic: false}}
        """)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp: Path = tmp_path_factory.mktemp("dashboard")
    with aiohttp_server(make_app(chunks=4)) as upstream:
        policy = tmp / "policy.yaml"
        policy.write_text(_policy(upstream.url))
        settings = Settings(policy=policy, admin_key=ADMIN_KEY, redis_url=None, embedder=None, cache=True)
        with gateway_server(settings) as gw:
            yield gw, upstream


def _chat(gw, text: str) -> httpx.Response:
    r = httpx.post(gw.url + "/v1/chat/completions", headers=DEMO, timeout=30,
                   json={"model": "auto", "temperature": 0, "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r


def _data(gw) -> dict:
    r = httpx.get(gw.url + "/dashboard/data", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def test_access_needs_the_admin_key(stack):
    gw, _ = stack
    page = httpx.get(gw.url + "/dashboard")
    assert page.status_code == 401 and 'name="key"' in page.text  # a sign-in form, not a bare error
    assert httpx.get(gw.url + "/dashboard?key=wrong").status_code == 401
    assert httpx.get(gw.url + "/dashboard/data").status_code == 401
    assert httpx.get(gw.url + "/dashboard/data", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(gw.url + "/dashboard/data", cookies={"tiergate_dashboard": "forged"}).status_code == 401
    assert httpx.get(gw.url + "/dashboard/data", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 200


def test_key_in_the_url_becomes_a_cookie_and_leaves_the_url(stack):
    gw, _ = stack
    with httpx.Client(base_url=gw.url) as client:
        r = client.get("/dashboard", params={"key": ADMIN_KEY})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert ADMIN_KEY not in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        page = client.get("/dashboard")  # the cookie alone now opens the page and the data
        assert page.status_code == 200 and "live status" in page.text
        assert client.get("/dashboard/data").status_code == 200


def test_page_is_self_contained_and_locked_down(stack):
    """The page is static files of the gateway's own: no inline script or style may run, nothing external loads."""
    gw, _ = stack
    page = httpx.get(gw.url + "/dashboard", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "style-src 'self'" in csp and "unsafe-inline" not in csp
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "every script is a file, none inline"
    assert "<style" not in page.text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text), "no external resources (no CDN)"
    assert page.headers["cache-control"] == "no-store"
    for path, kind in re.findall(r'(?:src|href)="(/dashboard/static/[^"]+\.(js|css))"', page.text):
        asset = httpx.get(gw.url + path)
        assert asset.status_code == 200 and len(asset.content) > 500, path
        assert asset.headers["content-type"].startswith("text/css" if kind == "css" else ("text/javascript",
                                                                                          "application/javascript"))
    assert {k for _, k in re.findall(r'(?:src|href)="(/dashboard/static/[^"]+\.(js|css))"', page.text)} == {"js", "css"}


def test_dashboard_disabled_without_an_admin_key(tmp_path):
    with aiohttp_server(make_app()) as upstream:
        policy = tmp_path / "policy.yaml"
        policy.write_text(_policy(upstream.url))
        with gateway_server(Settings(policy=policy, admin_key=None, cache=False)) as gw:
            assert httpx.get(gw.url + "/dashboard").status_code == 403
            assert httpx.get(gw.url + "/dashboard/data", headers={"Authorization": "Bearer x"}).status_code == 403


def test_data_counts_the_traffic_and_lists_backends_and_policy(stack):
    gw, upstream = stack
    before = _data(gw)["traffic"]["totals"]
    marker = uuid.uuid4().hex
    for i in range(3):
        _chat(gw, f"{marker} question {i}")
    _chat(gw, f"{marker} question 0")  # the same question again: an exact cache hit
    after = _data(gw)
    totals = after["traffic"]["totals"]
    assert totals["requests"] - before["requests"] == 4
    assert totals["by_tier"].get("edge", 0) - before["by_tier"].get("edge", 0) == 3
    assert totals["by_tier"].get("cache", 0) - before["by_tier"].get("cache", 0) == 1
    assert totals["by_cache"].get("hit-exact", 0) - before["by_cache"].get("hit-exact", 0) == 1
    assert after["traffic"]["tiers"]["edge"]["p95_ms"] > 0
    tiers = {t["name"]: t for t in after["tiers"]}
    assert tiers["edge"]["kind"] == "edge" and tiers["edge"]["healthy"] is True
    assert upstream.url in [e["base_url"] for e in tiers["edge"]["endpoints"]]
    store = gw.gateway.policy_store
    assert after["policy"]["version"] == store.current.version
    assert after["ready"] is True


def test_page_shows_live_numbers_that_change_as_traffic_flows(stack, tmp_path):
    gw, upstream = stack
    node_id = f"jetson-{uuid.uuid4().hex[:6]}"
    hb = httpx.post(gw.url + "/edge/v1/heartbeat", json={"node_id": node_id, "url": upstream.url, "model": "instant",
                                                          "slots": 4, "busy": 3, "queued": 0, "ctx": 2048},
                    headers=CLAIM)
    assert hb.status_code == 200, hb.text

    with chromium() as browser:
        browser.get(gw.url + "/dashboard")
        assert browser.find_elements("css selector", "input[name=key]"), "expected the sign-in form"
        browser.find_element("css selector", "input[name=key]").send_keys(ADMIN_KEY)
        browser.find_element("css selector", "button[type=submit]").click()
        wait_for(browser, lambda d: d.current_url == gw.url + "/dashboard" and text_of(d, "#ready") == "ready",
                 "the signed-in page to load its first data")
        assert ADMIN_KEY not in browser.current_url

        # the policy and the backends are on the page
        version = gw.gateway.policy_store.current.version
        wait_for(browser, lambda d: text_of(d, '[data-policy="version"]') == str(version), "the policy version")
        wait_for(browser, lambda d: d.find_elements("css selector", f'[data-endpoint="{node_id}"]'),
                 "the edge node that registered by heartbeat")
        node_load = text_of(browser, f'[data-endpoint="{node_id}"] [data-col="load"]')
        assert node_load == "75.0%", node_load  # 3 busy of 4 slots, as its heartbeat said

        # traffic flows: the numbers on the page follow
        total0 = int(text_of(browser, '[data-metric="total"]').replace(",", ""))
        marker = uuid.uuid4().hex
        for i in range(5):
            _chat(gw, f"{marker} first wave {i}")
        wait_for(browser, lambda d: int(text_of(d, '[data-metric="total"]').replace(",", "")) == total0 + 5,
                 "the total to count the first wave")
        edge_requests = text_of(browser, 'tr[data-tier="edge"] [data-col="requests"]')
        assert int(edge_requests) >= 5
        assert text_of(browser, 'tr[data-tier="edge"] [data-col="p95"]').endswith(("ms", "s"))
        assert browser.find_elements("css selector", "#chart rect"), "the per-second chart draws bars"
        assert float(text_of(browser, '[data-metric="rps"]')) > 0

        for i in range(3):  # the same prompts again: answered by the cache
            _chat(gw, f"{marker} first wave {i}")
        wait_for(browser, lambda d: int(text_of(d, '[data-metric="total"]').replace(",", "")) == total0 + 8,
                 "the total to count the second wave")
        wait_for(browser, lambda d: d.find_elements("css selector", 'tr[data-tier="cache"]'),
                 "a cache row in the latency table")
        hit_rate = text_of(browser, '[data-metric="hit-rate"]')
        assert hit_rate not in ("–", "0%"), hit_rate
        assert int(text_of(browser, '[data-cache="hit-exact"]')) >= 3
        browser.save_screenshot(str(tmp_path / "dashboard.png"))


def test_data_carries_history_and_says_when_the_policy_prices_nothing(stack):
    gw, _ = stack
    _chat(gw, f"{uuid.uuid4().hex} history")
    data = _data(gw)
    assert data["policy"]["costs"] is None  # this policy has no costs section
    history = data["history"]
    assert set(history) == {"step_s", "series", "costs", "tenants", "tenants_total"}
    assert history["tenants"] == [] and history["costs"]["saved_by"] == {}
    assert set(history["series"]) == {"t", "requests", "spend", "saved", "saved_by", "hit_rate", "cascade_kept_rate"}


@pytest.fixture(scope="module")
def priced_stack(tmp_path_factory):
    """The same gateway with prices: the edge cheap, the cloud (the reference) dear, so edge answers save."""
    tmp: Path = tmp_path_factory.mktemp("dashboard-priced")
    with aiohttp_server(make_app(chunks=4)) as upstream:
        policy = tmp / "policy.yaml"
        policy.write_text(_policy(upstream.url) + textwrap.dedent("""\
            costs:
              currency: USD
              reference_tier: cloud
              prices:
                edge: {prompt_per_1k: 0.01, completion_per_1k: 0.02}
                cloud: {prompt_per_1k: 1.0, completion_per_1k: 4.0}
            """))
        settings = Settings(policy=policy, admin_key=ADMIN_KEY, redis_url=None, embedder=None, cache=True)
        with gateway_server(settings) as gw:
            yield gw


def test_the_page_charts_cost_and_savings_over_time_with_their_quality_cost(priced_stack, tmp_path):
    gw = priced_stack
    marker = uuid.uuid4().hex
    with chromium() as browser:
        browser.get(f"{gw.url}/dashboard?key={ADMIN_KEY}")
        wait_for(browser, lambda d: text_of(d, "#ready") == "ready", "the page's first data")
        steps = len(_data(gw)["history"]["series"]["t"])
        for i in range(6):
            _chat(gw, f"{marker} priced {i}")
        for i in range(2):  # answered by the cache: saves the whole all-cloud price
            _chat(gw, f"{marker} priced {i}")
        # a step after the traffic, the charts draw it: one line per tier, spend against all-cloud, the savings
        wait_for(browser, lambda d: len(_data(gw)["history"]["series"]["t"]) > steps + 1, "two more history steps",
                 timeout_s=60)
        wait_for(browser, lambda d: d.find_elements("css selector", '#h-saved path[data-series="edge"]')
                 and d.find_elements("css selector", '#h-saved path[data-series="cache"]'),
                 "the savings chart's edge and cache lines", timeout_s=30)
        assert browser.find_elements("css selector", '#h-requests path[data-series="edge"]')
        assert browser.find_elements("css selector", '#h-spend path[data-series="spend"]')
        assert browser.find_elements("css selector", '#h-spend path[data-series="all-cloud"]')
        assert browser.find_elements("css selector", '#h-rates path[data-series="cache hit rate"]')
        history = _data(gw)["history"]
        saved = float(text_of(browser, '[data-total="saved"]').split()[0])
        assert saved == pytest.approx(history["costs"]["saved"], rel=1e-3) and saved > 0
        assert "shadow checks wrong" in text_of(browser, '[data-total="quality"]')  # never a saving alone
        tenant = history["tenants"][0]["tenant"]
        row = browser.find_element("css selector", f'#tenants tr[data-tenant="{tenant}"]')
        assert float(row.find_elements("css selector", "td")[1].text) == pytest.approx(
            history["tenants"][0]["spend"], rel=1e-3)
        shot = Path(os.environ.get("TIERGATE_SCREENSHOT_DIR", tmp_path)) / "status-page.png"
        browser.set_window_size(1400, 1700)
        browser.save_screenshot(str(shot))
