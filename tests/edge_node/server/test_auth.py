"""The edge node's API key middleware: 401 in the OpenAI format without the key, `/health` always open."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from tiergate.edge_node.server.auth import ApiKeyMiddleware

KEY, OTHER = "node-api-key-0123456789", "second-key-0123456789"


def client(keys: tuple[str, ...]) -> TestClient:
    async def ok(_request):
        return JSONResponse({"ok": True})

    routes = [Route(p, ok, methods=["GET", "POST"]) for p in ("/v1/chat/completions", "/v1/models", "/health",
                                                               "/metrics", "/_test/hold")]
    return TestClient(Starlette(routes=routes, middleware=[Middleware(ApiKeyMiddleware, keys=keys)]))


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/metrics", "/_test/hold"])
@pytest.mark.parametrize("auth", [None, "Bearer wrong-key-0123456789", f"Basic {KEY}", "Bearer ", KEY])
def test_without_the_key_every_route_but_health_is_a_401_in_the_openai_format(path, auth):
    headers = {"Authorization": auth} if auth is not None else {}
    r = client((KEY,)).post(path, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert (err["type"], err["code"]) == ("authentication_error", "invalid_api_key")


def test_any_configured_key_opens_the_api_and_health_needs_none():
    c = client((KEY, OTHER))
    for key in (KEY, OTHER):
        assert c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}).json() == {"ok": True}
        assert c.get("/v1/models", headers={"Authorization": f"bearer {key}"}).status_code == 200
    assert c.get("/health").status_code == 200


def test_without_keys_the_api_is_open():
    assert client(()).post("/v1/chat/completions").status_code == 200
