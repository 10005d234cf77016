"""A hung backend fails over: a backend that stops answering its health checks (hung, SIGSTOPped) while requests
wait for their answers to begin is declared lost by its pool, and those requests are retried elsewhere.

A JSON answer's headers come only once it is generated, so without this a hung backend held a JSON request for
the request's whole `total_s` (docs/reliability.md, bug 15). Here `total_s` and `first_byte_s` are 60 s and 30 s:
an answer well before them can only come from the failover. The backends are `tests/support/instant_upstream.py` in mode
`frozen` (nothing answered at all, /health included). tests/chaos/test_edge_stop.py and test_vllm_stop.py do the
same with real processes and SIGSTOP.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import KEYS
from tests.support.instant_upstream import HITS, MODE, make_app
from tests.support.registration import CLAIM
from tests.support.servers import aiohttp_server, gateway_server
from tests.support.waiting import wait_until
from tiergate.gateway.settings import Settings

AUTH = {"Authorization": "Bearer key-alpha-1"}
HEARTBEAT = {"node_id": "frozen-node", "model": "edge-model", "slots": 4}


def _policy(path: Path, edge: list[str], cloud: list[str], first: str) -> Path:
    other = "cloud" if first == "edge" else "edge"
    path.write_text(f"""\
version: 1
defaults:
  timeouts: {{connect_s: 1, first_byte_s: 30, between_chunks_s: 30, total_s: 60, queue_s: 5}}
  cache: {{enabled: false}}
tiers:
  edge: {{kind: edge, model: tiergate-edge, endpoints: {edge}}}
  cloud: {{kind: cloud, model: tiergate-cloud, served_model: cloud-model, endpoints: {cloud}}}
rules:
  - {{name: default, tier: {first}, fallbacks: [{other}]}}
""".replace("'", '"'))
    return path


@contextmanager
def _stack(tmp_path: Path, first: str, registered: bool = False):
    """An edge and a cloud backend, the tier `first` tried first; with `registered`, the edge backend joins by
    heartbeat instead of being a static endpoint."""
    with aiohttp_server(make_app(4, model="edge-model")) as edge, \
            aiohttp_server(make_app(4, model="cloud-model")) as cloud:
        policy = _policy(tmp_path / "policy.yaml", [] if registered else [edge.url], [cloud.url], first)
        with gateway_server(Settings(policy=policy, embedder=None, redis_url=None), keyring=KEYS,
                            ready=not registered) as gw:
            if registered:
                hb = HEARTBEAT | {"url": edge.url}
                assert httpx.post(gw.url + "/edge/v1/heartbeat", json=hb, headers=CLAIM, timeout=10).status_code == 200
            yield gw, edge, cloud


def _ask(gw, stream: bool) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=120)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("first, registered", [("edge", False), ("edge", True), ("cloud", False)],
                         ids=["edge-static", "edge-registered", "cloud"])
def test_a_request_waiting_on_a_backend_that_hangs_is_retried_elsewhere(tmp_path, first, registered, stream):
    with _stack(tmp_path, first, registered) as (gw, edge, cloud):
        hung, other = (edge, cloud) if first == "edge" else (cloud, edge)
        assert _ask(gw, stream).headers["x-tiergate-tier"] == first  # healthy: the first tier answers
        hung.app[MODE] = "frozen"
        r = _ask(gw, stream)
        assert r.status_code == 200, r.text[:300]
        assert r.headers["x-tiergate-tier"] != first and r.headers["x-tiergate-fallback-from"] == first
        assert hung.app[HITS] == 2  # the second request did reach the hung backend before it was declared lost
        assert ("[DONE]" in r.text) if stream else r.json()["choices"]
        metrics = httpx.get(gw.url + "/metrics", timeout=10).text
        assert f'tiergate_upstream_errors_total{{kind="lost",tier="{first}"}} 1.0' in metrics
        hung.app[MODE] = "ok"  # and once it answers again (its heartbeats too, if registered), it is used again

        def back() -> bool:
            if registered:
                httpx.post(gw.url + "/edge/v1/heartbeat", json=HEARTBEAT | {"url": edge.url}, headers=CLAIM,
                           timeout=10)
            return _ask(gw, False).headers["x-tiergate-tier"] == first

        wait_until(back, timeout_s=60, interval_s=0.5, what=f"the {first} backend back in use")
