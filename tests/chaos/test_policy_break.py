"""Chaos: the policy file goes bad while traffic flows — half written, then semantically invalid, then good.

A real gateway (uvicorn) in front of instant backends that stream slowly, so streams are in flight at every
reload. No request may fail, the served policy version (/readyz) may change only when the good file lands,
and the good file's new rule must route traffic without a restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.record import record
from tests.chaos.traffic import Traffic, summarize
from tests.gateway.conftest import KEYS
from tests.support.instant_upstream import make_app
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.settings import Settings
from tiergate.policies.store import policy_version

pytestmark = pytest.mark.timeout(300)


def policy_text(edge: list[str], cloud: list[str], *, extra_rule: bool = False) -> str:
    new_rule = """\
  - name: chaos-new
    when: {keywords: {any: [urgent]}}
    tier: cloud
""" if extra_rule else ""
    return f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1.0, first_byte_s: 10, between_chunks_s: 10, total_s: 30, queue_s: 5}}
  cache: {{enabled: false}}
tiers:
  edge:
    kind: edge
    model: tiergate-edge
    endpoints: {edge!r}
  cloud:
    kind: cloud
    model: tiergate-cloud
    served_model: cloud-model
    endpoints: {cloud!r}
rules:
{new_rule}  - name: default
    tier: edge
    fallbacks: [cloud]
""".replace("'", '"')


def invalid_text(good: str) -> str:
    """Well-formed YAML that fails the whole-file checks: a fallback to a tier that does not exist."""
    return good.replace("fallbacks: [cloud]", "fallbacks: [clooud]")


def _version(url: str) -> str | None:
    try:
        return httpx.get(url + "/readyz", timeout=2).json().get("policy")
    except (httpx.HTTPError, ValueError):
        return None


def _reloads(url: str, result: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(f'tiergate_policy_reloads_total{{result="{result}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_broken_policy_written_during_traffic(tmp_path: Path):
    with aiohttp_server(make_app(6, "slow", model="edge-model")) as e1, \
            aiohttp_server(make_app(6, "slow", model="edge-model-2")) as e2, \
            aiohttp_server(make_app(6, "slow", model="cloud-model")) as cloud:
        path = tmp_path / "policy.yaml"
        good1 = policy_text([e1.url], [cloud.url])
        good2 = policy_text([e1.url, e2.url], [cloud.url], extra_rule=True)  # new rule and a new edge endpoint
        path.write_text(good1)
        v1, v2 = policy_version(good1.encode()), policy_version(good2.encode())
        settings = Settings(policy=path, embedder=None, redis_url=None)
        with gateway_server(settings, keyring=KEYS) as gw:
            url = gw.url
            assert _version(url) == v1
            versions: list[tuple[float, str | None]] = []

            def body(worker: int, seq: int) -> tuple[dict, str]:
                urgent = seq % 3 == 0
                text = f"{'urgent ' if urgent else ''}request {worker}-{seq}"
                return ({"model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 6,
                         "temperature": 1, "stream": seq % 4 != 1}, "urgent" if urgent else "plain")

            with Traffic(url, "key-alpha-1", body, workers=6, timeout_s=30) as traffic:
                traffic.wait_for(lambda o: o.kind == "complete", 12, what="warm-up answers")
                invalid_before = _reloads(url, "invalid")

                # 1. an editor's half-written save
                path.write_text(good1[: len(good1) // 2])
                wait_until(lambda: _reloads(url, "invalid") >= invalid_before + 1, timeout_s=15,
                           what="the half-written file to be rejected")
                versions.append((time.monotonic(), _version(url)))
                _answered_since(traffic, versions[-1][0], "answers while the half-written file is in place")
                # 2. complete YAML, semantically invalid
                path.write_text(invalid_text(good1))
                wait_until(lambda: _reloads(url, "invalid") >= invalid_before + 2, timeout_s=15,
                           what="the invalid policy to be rejected")
                versions.append((time.monotonic(), _version(url)))
                _answered_since(traffic, versions[-1][0], "answers while the invalid file is in place")
                # 3. the fix
                fixed_at = time.monotonic()
                path.write_text(good2)
                wait_until(lambda: _version(url) == v2, timeout_s=15, what="the good policy to be adopted")
                adopted_s = time.monotonic() - fixed_at
                traffic.wait_for(lambda o: o.started > fixed_at + adopted_s and o.rule == "chaos-new"
                                 and o.kind == "complete", 3, what="answers under the new rule")
                traffic.wait_for(lambda o: o.started > fixed_at + adopted_s and o.model == "edge-model-2"
                                 and o.kind == "complete", 1, timeout_s=30, what="answers from the new endpoint")
            outcomes = traffic.outcomes
            assert _version(url) == v2
        figures = summarize(outcomes, fixed_at, lambda o: o.rule == "chaos-new")
        figures.update(adopted_s=round(adopted_s, 3), versions_while_broken=sorted({v for _, v in versions}),
                       rejected_reloads=2, in_flight_streams_across_reloads=sum(
                           o.stream and o.started < fixed_at < o.ended for o in outcomes))
        record("policy_broken_during_traffic", figures)

    assert figures["lost"] == 0, [o for o in outcomes if o.kind == "lost"][:5]
    assert figures["errors"] == 0, figures["errors_by_kind"]
    assert figures["completed"] == figures["sent"]
    assert {v for _, v in versions} == {v1}  # neither bad file was ever served
    # Requests answered before the fix followed the old policy only; the new rule exists only after it.
    assert all(o.rule != "chaos-new" for o in outcomes if o.ended < fixed_at)
    assert figures["recovery_s"] is not None
    assert figures["in_flight_streams_across_reloads"] > 0



def _answered_since(traffic: Traffic, t: float, what: str) -> None:
    """Traffic kept flowing after `t`: six requests that started after it were answered in full."""
    traffic.wait_for(lambda o: o.started > t and o.kind == "complete", 6, timeout_s=30, what=what)

def test_policy_whose_model_file_does_not_load_is_rejected(tmp_path: Path):
    with aiohttp_server(make_app(4, "ok", model="edge-model")) as edge, \
            aiohttp_server(make_app(4, "ok", model="cloud-model")) as cloud:
        path = tmp_path / "policy.yaml"
        good = policy_text([edge.url], [cloud.url])
        path.write_text(good)
        (tmp_path / "complexity.json").write_text('{"format": "tiergate-compl')  # a half-copied model file
        with gateway_server(Settings(policy=path, embedder=None, redis_url=None), keyring=KEYS) as gw:
            invalid_before = _reloads(gw.url, "invalid")
            path.write_text("complexity_model: complexity.json\n" + good)
            wait_until(lambda: _reloads(gw.url, "invalid") > invalid_before or
                       _version(gw.url) != policy_version(good.encode()), timeout_s=15, what="the reload")
            r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": "Bearer key-alpha-1"},
                           json={"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                           timeout=10)
            assert r.status_code == 200, (r.status_code, r.text[:300])
            assert _version(gw.url) == policy_version(good.encode())  # the broken policy was not adopted
