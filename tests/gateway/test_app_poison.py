"""A request that crashes whatever serves it, through a whole gateway: it reaches two backends at most, is then
refused on sight, and neither it nor its tenant's other failures take a backend away from other tenants."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import stack
from tests.support.instant_upstream import HITS

POISON = {"model": "auto", "messages": [{"role": "user", "content": "POISON give json"}], "max_tokens": 4}
FINE = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
ALPHA, BETA = {"Authorization": "Bearer key-alpha-1"}, {"Authorization": "Bearer key-beta-1"}


def test_a_poison_request_breaks_two_backends_at_most_then_is_refused_and_others_are_served(tmp_path):
    with stack(tmp_path, edge_modes=("poison", "poison"), cloud_modes=("poison",)) as s:
        url = s["gw"].url + "/v1/chat/completions"
        backends = [*s["edges"], *s["clouds"]]

        def hits() -> int:
            return sum(b.app[HITS] for b in backends)

        first = httpx.post(url, json=POISON, headers=ALPHA, timeout=30)
        assert first.status_code == 400 and first.json()["error"]["code"] == "request_quarantined"
        assert hits() == 2  # one backend broke, one other was tried and broke too; the third never saw it
        again = httpx.post(url, json={**POISON, "stream": True}, headers=BETA, timeout=30)  # another tenant, streamed
        assert again.status_code == 400 and again.json()["error"]["code"] == "request_quarantined" and hits() == 2

        for i in range(4):  # the same tenant's variations: each breaks its two backends, then is quarantined
            r = httpx.post(url, headers=ALPHA, timeout=30,
                           json={**POISON, "messages": [{"role": "user", "content": f"POISON {i}"}]})
            assert r.json()["error"]["code"] == "request_quarantined"
        # One tenant's breakages never cooled a node down: another tenant is still served by the edge.
        for _ in range(3):
            ok = httpx.post(url, json=FINE, headers=BETA, timeout=30)
            assert ok.status_code == 200 and ok.headers["x-tiergate-tier"] == "edge", ok.text
        gw = s["gw"].gateway
        assert gw.registry.get_sample_value("tiergate_poison_requests_total", {"outcome": "quarantined"}) == 5
