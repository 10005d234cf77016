"""`gateway.pipeline.Completions`: one request, one policy version, from its check to its settlement.

Most of the pipeline is exercised through the whole app (tests/gateway/test_app.py, test_app_limits.py); this file
holds what is about the pipeline's own contract."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from tests.support.instant_upstream import GATE, OPENED, make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.auth import KeyRing
from tiergate.gateway.settings import Settings

KEYS = KeyRing.from_inline("key-acme-1=acme:normal")


def _policy(path: Path, cloud: str, rule: str, distill: str) -> None:
    path.write_text(f"""
version: 1
defaults: {{cache: {{enabled: false}}, timeouts: {{connect_s: 1, first_byte_s: 60, total_s: 60}}}}
tiers:
  cloud: {{kind: cloud, model: tiergate-cloud, stand_in: true, endpoints: ["{cloud}"]}}
rules:
  - name: {rule}
    tier: cloud
distill: {distill}
""")


def test_a_reload_mid_request_leaves_the_request_under_the_version_it_began_with(tmp_path):
    """The backend holds the request while the policy file changes to a version with another rule name and no
    capture; once the new version is active the backend answers. The request is still answered, accounted and
    captured for distillation under the version it was decided under, and the next request under the new one."""
    records, policy = tmp_path / "distill.jsonl", tmp_path / "p.yaml"
    with aiohttp_server(make_app(chunks=4, mode="role_gated", model="cloud-model")) as cloud:
        _policy(policy, cloud.url, "first", "{tenants: [acme], rules: [first]}")
        settings = Settings(policy=policy, embedder=None, redis_url=None, distill_file=records)
        with gateway_server(settings, keyring=KEYS, ready=False) as gw:
            store = gw.gateway.policy_store
            got: dict[str, object] = {}

            def ask() -> None:
                with httpx.stream("POST", gw.url + "/v1/chat/completions", timeout=60,
                                  headers={"Authorization": "Bearer key-acme-1"},
                                  json={"model": "auto", "stream": True, "max_tokens": 4,
                                        "messages": [{"role": "user", "content": "hello"}]}) as r:
                    got["rule"], got["events"] = r.headers["x-tiergate-rule"], [x for x in r.iter_lines() if x]

            t = threading.Thread(target=ask)
            t.start()
            assert cloud.app[OPENED].wait(30)  # the request is at the backend, held
            before = store.current.version
            _policy(policy, cloud.url, "second", "null")
            wait_until(lambda: store.current.version != before, timeout_s=30, what="the new policy version active")
            cloud.app[GATE].set()
            t.join(60)
            assert got["rule"] == "first" and got["events"][-1] == "data: [DONE]", got
            wait_until(lambda: (gw.gateway.registry.get_sample_value("tiergate_distill_records_total",
                                                                     {"result": "recorded"}) or 0) == 1,
                       what="the answer captured under the first version's distill section")
            assert gw.gateway.registry.get_sample_value("tiergate_requests_total", {
                "endpoint": "chat", "tier": "cloud", "rule": "first", "cache": "bypass", "status": "200"}) == 1
            after = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer key-acme-1"},
                               json={"model": "auto", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]},
                               timeout=30)
            assert after.status_code == 200 and after.headers["x-tiergate-rule"] == "second"
    lines = [json.loads(x) for x in records.read_text().splitlines()]
    assert [(r["tenant"], r["rule"]) for r in lines] == [("acme", "first")]
