"""Edge registration cannot be hijacked (issue 39, item 2): a node id, once registered, is refreshed, replaced or
removed only by its own credentials; node URLs are checked; the no-credential mode is for this machine only."""

from __future__ import annotations

import httpx
import pytest
from aiohttp import web
from starlette.requests import Request

from tests.gateway.conftest import stack
from tests.support.instant_upstream import make_app
from tests.support.registration import claim
from tests.support.servers import aiohttp_server
from tiergate.core.edge_identity import node_api_key, node_key
from tiergate.core.errors import OpenAIError
from tiergate.gateway.edge_auth import EdgeAuth, from_this_machine

SECRET = "gateway-edge-secret-0123456789abcdef"
TOKEN = "shared-edge-token-0123"
API = {"Authorization": "Bearer key-alpha-1"}
CHAT = {"model": "auto", "messages": [{"role": "user", "content": "tenant beta's private prompt"}], "max_tokens": 4}


def recording_node(model: str) -> tuple[web.Application, list[str | None]]:
    """An instant OpenAI backend that records the Authorization of every completion it is sent."""
    app, seen = make_app(4, "ok", model=model), []

    @web.middleware
    async def record(request: web.Request, handler):
        if request.path.startswith("/v1/chat"):
            seen.append(request.headers.get("Authorization"))
        return await handler(request)

    app.middlewares.append(record)
    return app, seen


def bearer(key: str, *, who: str = "node") -> dict[str, str]:
    return {"Authorization": f"Bearer {key}", **claim(who)}


def test_only_a_nodes_own_key_refreshes_replaces_or_removes_its_registration(tmp_path):
    node_app, to_node = recording_node("edge-model")
    rogue_app, to_rogue = recording_node("edge-model")
    with stack(tmp_path, edge_modes=(), settings={"edge_secret": SECRET, "edge_token": TOKEN}) as s, \
            aiohttp_server(node_app) as node, aiohttp_server(rogue_app) as rogue:
        base = s["gw"].url
        beat = {"node_id": "node-a", "url": node.url, "model": "edge-model", "slots": 4}
        r = httpx.post(base + "/edge/v1/heartbeat", json=beat, headers=bearer(node_key(SECRET, "node-a")))
        assert r.status_code == 200, r.text

        hijack = beat | {"url": rogue.url}  # replace: the rogue's URL under the node's id
        refresh = beat | {"busy": 0, "slots": 64}  # refresh: keep it alive, look idle
        for who, headers, status, code in [
            ("the shared token", bearer(TOKEN, who="rogue"), 409, "node_id_taken"),
            ("another node's key", bearer(node_key(SECRET, "node-b"), who="rogue"), 401, "invalid_api_key"),
            ("no credentials", claim("rogue"), 401, "invalid_api_key"),
        ]:
            for path, body in [("/edge/v1/heartbeat", hijack), ("/edge/v1/heartbeat", refresh),
                               ("/edge/v1/deregister", {"node_id": "node-a"})]:
                r = httpx.post(base + path, json=body, headers=headers)
                assert (r.status_code, r.json()["error"]["code"]) == (status, code), (who, path, r.text)

        for _ in range(6):  # the issue's rogue node got 3 of 6 prompts: now every one reaches the node
            assert httpx.post(base + "/v1/chat/completions", json=CHAT, headers=API).headers["x-tiergate-tier"] == \
                "edge"
        assert to_rogue == [] and to_node == [f"Bearer {node_api_key(node_key(SECRET, 'node-a'))}"] * 6

        # its own key takes back an id the shared token registered while it was away
        r = httpx.post(base + "/edge/v1/heartbeat", json=beat | {"node_id": "node-c", "url": rogue.url},
                       headers=bearer(TOKEN, who="rogue"))
        assert r.status_code == 200
        r = httpx.post(base + "/edge/v1/heartbeat", json=beat | {"node_id": "node-c"},
                       headers=bearer(node_key(SECRET, "node-c")))
        assert r.status_code == 200
        r = httpx.post(base + "/edge/v1/deregister", json={"node_id": "node-a"},
                       headers=bearer(node_key(SECRET, "node-a")))
        assert r.json() == {"ok": True, "known": True}


def test_with_the_shared_token_a_node_id_belongs_to_the_claim_that_registered_it(tmp_path):
    with stack(tmp_path, edge_modes=(), settings={"edge_token": TOKEN}) as s:
        base, node_url = s["gw"].url, s["clouds"][0].url
        beat = {"node_id": "node-a", "url": node_url, "model": "edge-model", "slots": 4}
        assert httpx.post(base + "/edge/v1/heartbeat", json=beat, headers=bearer(TOKEN)).status_code == 200
        for path, body in [("/edge/v1/heartbeat", beat | {"url": "http://127.0.0.1:9"}),
                           ("/edge/v1/heartbeat", beat), ("/edge/v1/deregister", {"node_id": "node-a"})]:
            r = httpx.post(base + path, json=body, headers=bearer(TOKEN, who="rogue"))
            assert r.status_code == 409 and r.json()["error"]["code"] == "node_id_taken", r.text
            assert "registered by another node" in r.json()["error"]["message"]
        r = httpx.post(base + "/edge/v1/heartbeat", json=beat, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-tiergate-node-claim"
        r = httpx.post(base + "/edge/v1/heartbeat", json=beat, headers=bearer("wrong-token-0123"))
        assert r.status_code == 401
        # once its owner leaves, the id is free
        assert httpx.post(base + "/edge/v1/deregister", json={"node_id": "node-a"},
                          headers=bearer(TOKEN)).json()["known"] is True
        assert httpx.post(base + "/edge/v1/heartbeat", json=beat, headers=bearer(TOKEN, who="rogue")).status_code \
            == 200


@pytest.mark.parametrize("url, says", [
    ("http://169.254.169.254", "metadata service"),
    ("http://169.254.169.254/latest/meta-data/?", "no query"),
    ("http://127.0.0.1:1/v1?x=", "no query"), ("http://127.0.0.1:1/#x", "no fragment"),
    ("http://user:pw@127.0.0.1:1", "credentials"), ("ftp://127.0.0.1:1", "http:// or https://"),
    ("gopher://127.0.0.1:1", "http:// or https://"), ("http://127.0.0.1:1/admin/", "no path"),
    ("http://0.0.0.0:1", "not a unicast"), ("http://[fe80::1]:1", "link-local"),
])
def test_a_url_the_gateway_will_not_call_is_a_400_naming_url(tmp_path_factory, url, says):
    with stack(tmp_path_factory.mktemp("urls"), edge_modes=()) as s:
        r = httpx.post(s["gw"].url + "/edge/v1/heartbeat", headers=claim(),
                       json={"node_id": "n1", "url": url, "model": "m"})
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["param"]) == (400, "invalid_heartbeat", "url"), r.text
    assert says in err["message"]


def _request(client: tuple[str, int] | None, headers: dict[str, str]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/edge/v1/heartbeat", "client": client,
                    "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]})


@pytest.mark.parametrize("client, headers, local", [
    (("127.0.0.1", 50000), {}, True), (("::1", 50000), {}, True),
    (("203.0.113.7", 50000), {"X-Forwarded-For": "127.0.0.1"}, False),  # the issue's bypass
    (("203.0.113.7", 50000), {"X-Real-IP": "127.0.0.1", "Forwarded": "for=127.0.0.1"}, False),
    (("10.0.0.5", 50000), {}, False),
    (("127.0.0.1", 50000), {"X-Forwarded-For": "203.0.113.7"}, False),  # relayed by a proxy on this machine
    (("127.0.0.1", 50000), {"Forwarded": "for=127.0.0.1"}, False),
    (None, {}, False), (("localhost", 1), {}, False),
])
def test_without_credentials_only_a_loopback_socket_with_no_proxy_headers_may_register(client, headers, local):
    request = _request(client, headers | claim())
    assert from_this_machine(request) is local
    auth = EdgeAuth(None, None)
    if local:
        auth.precheck(request)
        assert auth.identify(request, "n1").local
    else:
        with pytest.raises(OpenAIError) as refused:
            auth.precheck(request)
        assert refused.value.status == 401


def test_a_forwarded_for_header_does_not_pass_for_this_machine_end_to_end(tmp_path):
    with stack(tmp_path, edge_modes=()) as s:
        beat = {"node_id": "n1", "url": s["clouds"][0].url, "model": "m"}
        url = s["gw"].url + "/edge/v1/heartbeat"
        r = httpx.post(url, json=beat, headers={"X-Forwarded-For": "127.0.0.1", **claim()})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert httpx.post(url, json=beat, headers=claim()).status_code == 200


def test_the_issues_bypass_through_uvicorns_proxy_headers_is_refused():
    """Behind uvicorn's proxy-header rewriting that trusts the sender (FORWARDED_ALLOW_IPS='*', as an operator
    behind a load balancer might set), `X-Forwarded-For: 127.0.0.1` from another machine made the scope's client
    127.0.0.1. `tiergate serve` no longer rewrites it; and a request carrying a proxy header is never taken for
    one from this machine, whatever the scope says."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    async def register(request: Request):
        try:
            EdgeAuth(None, None).precheck(request)
        except OpenAIError as exc:
            return JSONResponse({"client": request.client.host, "status": exc.status})
        return JSONResponse({"client": request.client.host, "status": 200})

    app = ProxyHeadersMiddleware(Starlette(routes=[Route("/", register, methods=["POST"])]), trusted_hosts="*")

    async def send(headers: dict[str, str]) -> dict:
        transport = httpx.ASGITransport(app=app, client=("203.0.113.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            return (await c.post("/", headers=headers)).json()

    assert asyncio.run(send({"X-Forwarded-For": "127.0.0.1"})) == {"client": "127.0.0.1", "status": 401}
    assert asyncio.run(send({})) == {"client": "203.0.113.7", "status": 401}
