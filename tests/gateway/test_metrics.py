"""`gateway.metrics.exposition` and the /metrics route: an optional key (`TIERGATE_METRICS_KEY`) and an option to
leave tenant labels out (`TIERGATE_METRICS_TENANT_LABELS`), on a registry of known values and on a real gateway."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from tests.gateway.conftest import stack
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.metrics import exposition
from tiergate.gateway.settings import Settings

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "temperature": 1}
METRICS_KEY = "metrics-key-0123456789"


def _samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples}


@pytest.fixture
def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    limited = Counter("t_limited", "by tenant and limit", ["tenant", "limit"], registry=r)
    limited.labels("acme", "requests").inc(2)
    limited.labels("globex", "requests").inc(3)
    limited.labels("acme", "tokens").inc(1)
    seconds = Histogram("t_seconds", "by tenant", ["tenant"], buckets=(1, 10), registry=r)
    seconds.labels("acme").observe(0.5)
    seconds.labels("globex").observe(5)
    cutoff = Gauge("t_cutoff", "per tenant", ["tenant", "bound"], registry=r)
    cutoff.labels("acme", "0.05").set(0.9)
    Gauge("t_inflight", "no tenant", ["tier"], registry=r).labels("edge").set(4)
    Counter("t_requests", "no tenant", ["tier"], registry=r).labels("edge").inc(7)
    return r


def test_with_tenant_labels_the_page_is_the_registrys_own(registry):
    assert exposition(registry) == generate_latest(registry)
    assert b'tenant="acme"' in exposition(registry, tenant_labels=True)


def test_without_tenant_labels_counters_and_histograms_are_summed_and_tenant_gauges_left_out(registry):
    text = exposition(registry, tenant_labels=False)
    assert b"tenant=" not in text and b"acme" not in text and b"globex" not in text
    got = _samples(text)
    assert got[("t_limited_total", (("limit", "requests"),))] == 5
    assert got[("t_limited_total", (("limit", "tokens"),))] == 1
    assert got[("t_seconds_bucket", (("le", "1.0"),))] == 1 and got[("t_seconds_bucket", (("le", "10.0"),))] == 2
    assert got[("t_seconds_count", ())] == 2 and got[("t_seconds_sum", ())] == 5.5
    assert not [k for k in got if k[0] == "t_cutoff"]
    # series without a tenant label are untouched
    assert got[("t_inflight", (("tier", "edge"),))] == 4 and got[("t_requests_total", (("tier", "edge"),))] == 7
    created = {k: v for k, v in got.items() if k[0] == "t_limited_created"}
    assert len(created) == 2  # one per remaining label set, the earliest of those it merged


@pytest.mark.parametrize("key", ["short-key", "has a space in it 0123", "caf\u00e9-0123456789abcdef"])
def test_a_metrics_key_that_is_not_a_usable_bearer_key_is_refused_naming_the_setting(key):
    with pytest.raises(ValidationError) as err:
        Settings(metrics_key=key)
    assert "metrics_key" in str(err.value) and "TIERGATE_METRICS_KEY" in str(err.value)


def test_an_empty_metrics_key_means_none(monkeypatch):
    monkeypatch.setenv("TIERGATE_METRICS_KEY", "")
    assert Settings().metrics_key is None


def _rate_limited_once(tmp_path, settings: dict) -> tuple[httpx.Response, ...]:
    """A real gateway where tenant `acme` hits its limit once; its /metrics without a key, with a wrong one and
    with the right one."""
    keys = tmp_path / "keys.yaml"
    keys.write_text("tenants:\n  acme: {requests_per_minute: 1}\nkeys:\n  - {tenant: acme, key: acme-key-123}\n")
    with stack(tmp_path, keyring=KeyRing.from_file(keys), settings=settings) as s:
        base = s["gw"].url
        codes = [httpx.post(base + "/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer acme-key-123"},
                            timeout=30).status_code for _ in range(2)]
        assert codes == [200, 429]
        return (httpx.get(base + "/metrics", timeout=10),
                httpx.get(base + "/metrics", headers={"Authorization": "Bearer wrong-key-0123456789"}, timeout=10),
                httpx.get(base + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}, timeout=10))


def test_a_real_gateways_metrics_need_the_key_and_name_no_tenant_when_so_configured(tmp_path):
    bare, wrong, right = _rate_limited_once(tmp_path, {"metrics_key": METRICS_KEY, "metrics_tenant_labels": False})
    for refused in (bare, wrong):
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert "TIERGATE_METRICS_KEY" in refused.json()["error"]["message"]
    assert right.status_code == 200 and right.headers["content-type"].startswith("text/plain")
    assert 'tiergate_rate_limited_total{limit="requests"} 1.0' in right.text
    assert "tenant=" not in right.text and "acme" not in right.text
    assert "tiergate_requests_total" in right.text


def test_by_default_a_real_gateways_metrics_are_open_and_carry_tenant_labels(tmp_path):
    bare, _, _ = _rate_limited_once(tmp_path, {})
    assert bare.status_code == 200
    assert 'tiergate_rate_limited_total{limit="requests",tenant="acme"} 1.0' in bare.text
